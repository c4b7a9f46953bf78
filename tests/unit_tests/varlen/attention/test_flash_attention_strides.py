"""The flash backend hands the kernel strided views without copying them, with the same numbers.

megatron-core's SelfAttention gives the core attention K and V as views of its fused QKV
projection ([T, G, (N/G + 2) D] viewed per head: V's row stride is that whole row), and under
CP the flash backend slices K and V out of one gathered [T, G, 2 D] tensor. FlashAttention's
varlen kernel takes any row and head stride with a unit last-dimension stride (torch's
flash_api.cpp ``mha_varlen_fwd``/``mha_varlen_bwd`` check only ``stride(-1) == 1`` and pass
the other strides to the kernel; ``_flash_attention_backward`` makes ``grad_out`` and ``out``
contiguous itself), so ``attend_planned`` no longer copies them (``varlen_kernel.kernel_layout``).

Reference: the same call on contiguous copies of the same values: outputs and the gradients
of the fused buffer bitwise equal, through the kernel's CPU twin (which, like the kernel, now
refuses a non-unit last-dimension stride). tests/gpu/test_gpu_attention_strides.py checks the
real kernel the same way on CUDA.
Shape legend: T = packed padded tokens, N = query heads, G = kv groups, D = head dim.
"""

import functools

import pytest
import torch

from megatron.varlen.attention.attention_plan import build_attention_plan
from megatron.varlen.attention.flash_attention import attend_planned
from megatron.varlen.attention.varlen_kernel import emulated_varlen_attn, kernel_layout
from megatron.varlen.platform.host_syncs import count_dispatches
from tests.unit_tests.varlen.attention._reference import HEAD_DIM, NUM_HEADS, cu

REAL = [7, 16, 33, 1, 2, 3]
PADDED = [8, 16, 40, 8, 8, 24]
SCALE = HEAD_DIM ** -0.5
COPY_OPS = ("clone", "copy_", "contiguous")


def _fused_qkv(groups: int, seed: int) -> torch.Tensor:
    """[T, G, N/G + 2, D] leaf: per group its query heads, then its key, then its value, as
    megatron-core's linear_qkv lays them out."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(sum(PADDED), groups, NUM_HEADS // groups + 2, HEAD_DIM, generator=gen,
                       dtype=torch.float64, requires_grad=True)


def _views(fused: torch.Tensor, cp_slices: bool):
    """(q, k, v) as the core attention receives them: q contiguous (RoPE's output), k and v
    views of the fused buffer, or with ``cp_slices`` slices of one [T, G, 2 D] tensor."""
    per_group = fused.size(2) - 2
    q = fused[:, :, :per_group].reshape(fused.size(0), -1, HEAD_DIM) * 1.0
    k, v = fused[:, :, per_group], fused[:, :, per_group + 1]
    if cp_slices:
        kv = torch.cat([k, v], dim=-1) * 1.0  # the all-gather's result on one rank
        k, v = kv[..., :HEAD_DIM], kv[..., HEAD_DIM:]
    return q, k, v


def _run(groups: int, cp_slices: bool, contiguous: bool, causal: bool = True):
    """Output and the fused buffer's gradient of one planned call (CP 1: a square plan)."""
    fused = _fused_qkv(groups, seed=groups + 2 * cp_slices)
    q, k, v = _views(fused, cp_slices)
    if contiguous:
        q, k, v = (x.contiguous() for x in (q, k, v))
    plan = build_attention_plan(cu(REAL), cu(PADDED), cp_size=1, cp_rank=0, causal=causal)
    out = attend_planned(q, k, v, plan, SCALE, emulated_varlen_attn)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(7),
                         dtype=out.dtype)
    (out * weight).sum().backward()
    return out.detach(), fused.grad


@pytest.mark.parametrize("cp_slices", [False, True], ids=["fused-qkv", "cp-kv-slices"])
@pytest.mark.parametrize("groups", [2, NUM_HEADS], ids=["gqa", "mha"])
def test_strided_views_give_the_numbers_of_contiguous_copies(groups, cp_slices):
    out, grad = _run(groups, cp_slices, contiguous=False)
    expected_out, expected_grad = _run(groups, cp_slices, contiguous=True)
    assert torch.equal(out, expected_out)
    assert torch.equal(grad, expected_grad)
    assert float(grad.abs().sum()) > 0


@pytest.mark.parametrize("cp_slices", [False, True], ids=["fused-qkv", "cp-kv-slices"])
def test_aligned_views_reach_the_kernel_uncopied(cp_slices):
    q, k, v = _views(_fused_qkv(2, seed=0).detach(), cp_slices)
    assert not k.is_contiguous() and not v.is_contiguous()
    seen = []

    @functools.wraps(emulated_varlen_attn)  # the twin's signature: the same keywords
    def kernel(query, key, value, *args, **kwargs):
        seen.append((query, key, value))
        return emulated_varlen_attn(query, key, value, *args, **kwargs)

    plan = build_attention_plan(cu(PADDED), cu(PADDED), cp_size=1, cp_rank=0, causal=True)
    with count_dispatches() as counts:
        attend_planned(q, k, v, plan, SCALE, kernel)
    (query, key, value), = seen
    assert query is q and key is k and value is v  # the caller's views themselves
    copies = [(op, site) for (op, site) in counts
              if op in COPY_OPS and "flash_attention.py" in site]
    assert copies == [], copies


def test_only_what_the_kernel_cannot_take_is_copied():
    base = torch.randn(10, 4, 16)
    aligned = base[:, :, :8]  # row stride 64, head stride 16, start 0: 16-byte steps (fp32)
    assert kernel_layout(aligned) is aligned
    last_strided = base[:, :, ::2]  # stride(-1) == 2: the kernel refuses it
    assert kernel_layout(last_strided).is_contiguous()
    shifted = base[:, :, 1:9]  # starts 4 bytes into a row: not a 16-byte access
    assert kernel_layout(shifted).is_contiguous()
    odd_rows = torch.randn(10, 4, 9)[:, :, :8]  # head stride 9 floats: not 16-byte steps
    assert kernel_layout(odd_rows).is_contiguous()
    for view in (last_strided, shifted, odd_rows):
        assert torch.equal(kernel_layout(view), view)


def test_the_twin_refuses_what_the_kernel_refuses():
    q = torch.randn(8, NUM_HEADS, 2 * HEAD_DIM)[..., ::2]
    k = torch.randn(8, NUM_HEADS, HEAD_DIM)
    with pytest.raises(ValueError, match="query must have a contiguous last dimension"):
        emulated_varlen_attn(q, k, k, cu([8]), cu([8]), 8, 8)
