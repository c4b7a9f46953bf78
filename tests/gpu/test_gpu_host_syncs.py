"""The host-sync guard on a real GPU agrees with torch's own sync detector.

megatron/varlen/platform/host_syncs.py decides from the ATen op and its arguments whether a
call makes the host wait for the device; on CPU that is all the suite can check. Here each call
runs on CUDA under the guard (no emulation) and under ``torch.cuda.set_sync_debug_mode("warn")``
(tools/sync_probe.sync_sites): both must say "sync" or both "no sync". The no-sync cases include
the guard's two judgement calls: ``x[mask] = scalar`` (ATen runs it as masked_fill_) and
``repeat_interleave`` given its ``output_size``.

Run with `pytest -m gpu tests/gpu`; skipped without CUDA. Seconds.
"""

import pytest
import torch

from megatron.varlen.platform.host_syncs import host_syncs_of

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(120),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _tensors():
    x = torch.arange(8, device="cuda")
    return x, x > 3, torch.tensor([1, 0, 2, 1, 0, 1, 1, 2], device="cuda")


SYNCING = {
    "item": lambda x, m, r: x[0].item(),
    "bool": lambda x, m, r: bool(x[1] > 0),
    "tolist": lambda x, m, r: x.tolist(),
    "cpu": lambda x, m, r: x.cpu(),
    "nonzero": lambda x, m, r: torch.nonzero(m),
    "bool_index": lambda x, m, r: x[m],
    "repeat_interleave": lambda x, m, r: torch.repeat_interleave(x, r),
    "unique": lambda x, m, r: torch.unique(r),
    "equal": lambda x, m, r: torch.equal(x, x.clone()),  # (x, x) returns True unread
}
NOT_SYNCING = {
    "repeat_interleave_with_output_size":
        lambda x, m, r: torch.repeat_interleave(x, r, output_size=8),
    "bool_index_put_of_a_scalar": lambda x, m, r: x.clone().__setitem__(m, 0),
    "masked_fill": lambda x, m, r: x.masked_fill(m, 0),
    "index_with_int_tensor": lambda x, m, r: x[r],
}


@pytest.mark.parametrize("name", sorted(SYNCING) + sorted(NOT_SYNCING))
def test_guard_and_torch_sync_debug_mode_agree(name):
    from tools.sync_probe import sync_sites

    call = SYNCING.get(name) or NOT_SYNCING[name]
    tensors = _tensors()
    torch.cuda.synchronize()
    seen_by_torch = sync_sites(lambda: call(*tensors))
    seen_by_guard = host_syncs_of(lambda: call(*tensors), emulate=False)
    expected = name in SYNCING
    assert (bool(seen_by_torch), bool(seen_by_guard)) == (expected, expected), \
        (seen_by_torch, seen_by_guard)
