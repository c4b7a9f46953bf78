"""torch's varlen_attn on strided K/V views == on contiguous copies, bit for bit (CUDA).

The flash backend passes megatron-core's K and V (views of the fused QKV projection) and CP's
K/V slices to the kernel uncopied (megatron/varlen/attention/varlen_kernel.py
``kernel_layout``): FlashAttention's varlen entry points check only a unit last-dimension
stride and hand the row and head strides to the kernel. This is the proof on the GPU: the
outputs and the gradients of the fused buffer are bitwise equal to the same call on contiguous
copies (bf16; deterministic algorithms on, so that the backward's dQ accumulation has one
order). The CPU twin's version is tests/unit_tests/varlen/attention/
test_flash_attention_strides.py.

Run with `pytest -m gpu tests/gpu`; skipped without CUDA and varlen_attn.
"""

import pytest
import torch

from megatron.varlen.attention.attention_plan import build_attention_plan
from megatron.varlen.attention.flash_attention import attend_planned
from megatron.varlen.platform.accelerator import torch_varlen_attn

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available() or torch_varlen_attn() is None,
    reason="needs CUDA and torch.nn.attention.varlen.varlen_attn")]

LENGTHS = [8, 16, 40, 8, 8, 24, 200]
HEADS, HEAD_DIM = 8, 64
SCALE = HEAD_DIM ** -0.5


def _cu(lengths):
    return torch.tensor([0, *lengths]).cumsum(0).to(torch.int32)


def _run(groups: int, cp_slices: bool, contiguous: bool):
    """Output and fused-buffer gradient of one kernel call on megatron-core's layout."""
    gen = torch.Generator(device="cuda").manual_seed(groups + 2 * cp_slices)
    per_group = HEADS // groups
    fused = torch.randn(sum(LENGTHS), groups, per_group + 2, HEAD_DIM, device="cuda",
                        generator=gen).to(torch.bfloat16).requires_grad_()
    q = fused[:, :, :per_group].reshape(fused.size(0), HEADS, HEAD_DIM) * 1.0
    k, v = fused[:, :, per_group], fused[:, :, per_group + 1]
    if cp_slices:  # the all-gathered [T, G, 2 D] K/V of CP, sliced
        kv = torch.cat([k, v], dim=-1) * 1.0
        k, v = kv[..., :HEAD_DIM], kv[..., HEAD_DIM:]
    if contiguous:
        q, k, v = (x.contiguous() for x in (q, k, v))
    plan = build_attention_plan(_cu(LENGTHS), _cu(LENGTHS), 1, 0).to(torch.device("cuda"))
    out = attend_planned(q, k, v, plan, SCALE)
    weight = torch.randn(out.shape, device="cuda", generator=gen)
    (out.float() * weight).sum().backward()
    return out.detach(), fused.grad


@pytest.mark.parametrize("cp_slices", [False, True], ids=["fused-qkv", "cp-kv-slices"])
@pytest.mark.parametrize("groups", [2, HEADS], ids=["gqa", "mha"])
def test_strided_views_equal_contiguous_copies_bitwise(groups, cp_slices):
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        out, grad = _run(groups, cp_slices, contiguous=False)
        expected_out, expected_grad = _run(groups, cp_slices, contiguous=True)
    finally:
        torch.use_deterministic_algorithms(deterministic)
    assert torch.equal(out, expected_out)
    assert torch.equal(grad, expected_grad)
    assert float(grad.float().abs().sum()) > 0
