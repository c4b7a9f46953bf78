"""RoPE from one table per micro-batch on a real GPU: megatron-core's THD RoPE bit for bit (CUDA
kernels, fp32 and bf16, every CP place; outputs and gradients), and a layer's rotation -- the
cached table and ``t * cos + rotate_half(t) * sin`` for q and k, forward and backward -- makes no
synchronising call (megatron-core's reads the boundaries back in every layer).

Run with `pytest -m gpu tests/gpu` on a CUDA machine; skipped elsewhere. The same comparison
runs on CPU in tests/unit_tests/varlen/attention/test_packed_rope.py, whose helpers this uses.
"""

import pytest
import torch

from megatron.varlen.attention.packed_rope import packed_rope_table
from megatron.varlen.packing.packed_seq import varlen_packed_seq_params
from tests.unit_tests.varlen.attention import test_packed_rope as cpu_case

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs CUDA")]
CUDA = torch.device("cuda")


def _freqs_on(device, rotary_percent, interleaved, rows):
    return cpu_case._freqs(rotary_percent, interleaved, rows).to(device)


def check_bitwise(variant: str, dtype: torch.dtype, device: torch.device) -> None:
    """Every CP place, q and k head counts: outputs and gradients equal megatron-core's."""
    rotary_percent, interleaved, mscale = cpu_case.VARIANTS[variant]
    padded = cpu_case._padded_lengths()
    cu_padded = cpu_case._cu(padded)  # host, as the packing layer keeps it
    freqs = _freqs_on(device, rotary_percent, interleaved, max(padded))
    for cp, rank in cpu_case.CP_PLACES:
        for heads in (cpu_case.Q_HEADS, cpu_case.KV_HEADS):
            t = cpu_case._tokens(heads, sum(padded) // cp, dtype, seed=cp + rank).to(device)
            ref, new, grad_ref, grad_new = cpu_case._rotate_both_ways(
                t, freqs, cu_padded, cp, rank, interleaved, mscale)
            assert torch.equal(new, ref) and torch.equal(grad_new, grad_ref), (cp, rank, heads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("variant", list(cpu_case.VARIANTS))
def test_equals_megatron_core_bit_for_bit_on_gpu(variant, dtype):
    check_bitwise(variant, dtype, CUDA)


def test_layer_rotation_makes_no_synchronising_call():
    from tools.sync_probe import profiled_sync_events, sync_sites

    padded = cpu_case._padded_lengths()
    real, cu_padded = cpu_case._cu(cpu_case.REAL_LENGTHS), cpu_case._cu(padded)
    params = varlen_packed_seq_params(real.to(CUDA), cu_padded.to(CUDA), real, cu_padded,
                                      max(padded), local_cp_size=None)
    freqs = _freqs_on(CUDA, 1.0, False, max(padded))
    q = cpu_case._tokens(cpu_case.Q_HEADS, sum(padded) // 2, torch.bfloat16, 0).to(CUDA)
    k = cpu_case._tokens(cpu_case.KV_HEADS, sum(padded) // 2, torch.bfloat16, 1).to(CUDA)
    q, k = q.unsqueeze(1).requires_grad_(), k.unsqueeze(1).requires_grad_()

    def layer_step():  # what every layer after the micro-batch's first does
        table = packed_rope_table(params, freqs, 2, 1, 1.0, torch.bfloat16)
        rotated = [table.rotate(x, False) for x in (q, k)]
        sum(x.float().sum() for x in rotated).backward()

    layer_step()  # the micro-batch's first layer builds the table
    syncs = profiled_sync_events(layer_step)
    assert syncs["events"] == 0, syncs
    assert sync_sites(layer_step) == []
