"""Flash backend on a real GPU: torch's varlen_attn laid out by the attention plan == the
reference attention (outputs and gradients, bf16 tolerance), and no synchronising call (profiler
events beyond an empty region's, and torch's sync debug mode: tools/sync_probe.py).

Run with `pytest -m gpu tests/gpu` on a CUDA machine; skipped elsewhere. CP is emulated on one
GPU exactly as in tests/unit_tests/varlen/attention/test_flash_attention.py (there with the
kernel's CPU twin): every rank's plan on its shard, K/V in the all-gather's rank order.
"""

import math

import pytest
import torch

from megatron.varlen.attention import LOCAL_ONLY_CP_GROUP, varlen_attention
from megatron.varlen.attention.attention_plan import build_attention_plan
from megatron.varlen.attention.flash_attention import attend_planned
from megatron.varlen.platform.accelerator import torch_varlen_attn
from megatron.varlen.packing.cp_split import restore_thd_from_cp_shards, split_thd_for_cp

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available() or torch_varlen_attn() is None,
    reason="needs CUDA and torch.nn.attention.varlen.varlen_attn")]

REAL = [7, 16, 33, 1, 2, 3, 200]
PADDED = [8, 16, 40, 8, 8, 24, 200]
HEADS, HEAD_DIM = 8, 64
SCALE = 1.0 / math.sqrt(HEAD_DIM)
# bf16 kernel vs fp32 reference on unit-variance inputs (bf16 has 8 mantissa bits).
ATOL = 3e-2


def _cu(lengths):
    return torch.tensor([0, *lengths]).cumsum(0).to(torch.int32)


def _inputs(groups, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    total = sum(PADDED)
    make = lambda h: torch.randn(total, h, HEAD_DIM, device="cuda", generator=gen)  # noqa
    return make(HEADS), make(groups), make(groups), make(HEADS)


def _grads(fn, q, k, v, weight, dtype):
    q, k, v = (x.detach().to(dtype).requires_grad_() for x in (q, k, v))
    out = fn(q, k, v)
    (out.float() * weight).sum().backward()
    return [t.float() for t in (out.detach(), q.grad, k.grad, v.grad)]


def _flash_cp(cp, window=None):
    padded = _cu(PADDED)

    def run(q, k, v):
        split = lambda x, r: split_thd_for_cp(x, padded, cp, r, seq_dim=0)  # noqa: E731
        k_rows = torch.cat([split(k, r) for r in range(cp)])
        v_rows = torch.cat([split(v, r) for r in range(cp)])
        shards = [attend_planned(split(q, r), k_rows, v_rows,
                                 build_attention_plan(_cu(REAL), padded, cp, r, True,
                                                      window).to(q.device),
                                 SCALE) for r in range(cp)]
        return restore_thd_from_cp_shards(shards, padded, seq_dim=0)

    return run


@pytest.mark.parametrize("groups", [2, HEADS], ids=["gqa", "mha"])
@pytest.mark.parametrize("cp", [1, 2, 4])
def test_flash_equals_reference_attention(cp, groups):
    q, k, v, weight = _inputs(groups, seed=cp)
    reference = lambda q, k, v: varlen_attention(  # noqa: E731
        q, k, v, _cu(PADDED), _cu(REAL), LOCAL_ONLY_CP_GROUP, True, SCALE)
    expected = _grads(reference, q, k, v, weight, torch.float32)
    got = _grads(_flash_cp(cp), q, k, v, weight, torch.bfloat16)
    for name, g, e in zip(["out", "dq", "dk", "dv"], got, expected):
        error = float((g - e).abs().max())
        assert error < ATOL * max(1.0, float(e.abs().max())), (name, cp, groups, error)


@pytest.mark.parametrize("cp", [1, 2])
def test_flash_sliding_window_equals_reference_attention(cp):
    """torch's kernel with the plan's bottom-right window (W, 0) == the local attention's
    windowed mask (itself == a float64 windowed softmax on CPU, test_sliding_window.py)."""
    window = 5
    q, k, v, weight = _inputs(2, seed=20 + cp)
    reference = lambda q, k, v: varlen_attention(  # noqa: E731
        q, k, v, _cu(PADDED), _cu(REAL), LOCAL_ONLY_CP_GROUP, True, SCALE, window_left=window)
    expected = _grads(reference, q, k, v, weight, torch.float32)
    got = _grads(_flash_cp(cp, window), q, k, v, weight, torch.bfloat16)
    for name, g, e in zip(["out", "dq", "dk", "dv"], got, expected):
        error = float((g - e).abs().max())
        assert error < ATOL * max(1.0, float(e.abs().max())), (name, cp, error)


def test_flash_forward_backward_makes_no_synchronising_copy():
    from tools.sync_probe import profiled_sync_events, sync_sites

    q, k, v, weight = _inputs(2, seed=9)
    plan = build_attention_plan(_cu(REAL), _cu(PADDED), 1, 0).to(torch.device("cuda"))
    q, k, v = (x.to(torch.bfloat16).requires_grad_() for x in (q, k, v))

    def step():
        out = attend_planned(q, k, v, plan, SCALE)
        (out.float() * weight).sum().backward()

    step()  # warm-up
    syncs = profiled_sync_events(step)
    assert syncs["events"] == 0, syncs
    assert sync_sites(step) == []


def test_local_backend_forward_backward_makes_no_synchronising_copy():
    """--attention-backend local (what auto picks with attention dropout > 0): its layout is
    built once from host boundaries; the forward and backward, dropout included, read nothing."""
    from megatron.varlen.attention.core_attention import attend_with_layout, build_local_layout
    from tools.sync_probe import profiled_sync_events, sync_sites

    q, k, v, weight = _inputs(2, seed=10)
    layout = build_local_layout(_cu(PADDED), _cu(REAL), 1, 0, torch.device("cuda"))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    dropout = torch.nn.Dropout(0.1)

    def step():
        out = attend_with_layout(q, k, v, layout, LOCAL_ONLY_CP_GROUP, True, SCALE, dropout)
        (out * weight).sum().backward()

    step()  # warm-up
    syncs = profiled_sync_events(step)
    assert syncs["events"] == 0, syncs
    assert sync_sites(step) == []
