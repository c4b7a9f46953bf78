"""The host-sync guard (megatron/varlen/platform/host_syncs.py) sees what would sync on CUDA.

Each case is one call that on CUDA makes the host wait for the device (or does not), run on CPU
under the guard, which emulates a device: tensors made before the guard stand for device memory.
The expected sites are this file's own lines, found by reading the source (not by running the
guard), so a guard that records the wrong frame fails too.
"""

import inspect

import pytest
import torch

from megatron.varlen.packing.packed_seq import host_to_device
from megatron.varlen.platform.host_syncs import HostSyncGuard, count_dispatches, host_syncs_of

HERE = "tests/unit_tests/varlen/test_host_syncs.py"


def _device_tensors():
    x = torch.arange(8)
    return x, x > 3, torch.tensor([1, 0, 2, 1, 0, 1, 1, 2])


# name: (the call, the op the guard reports). Each lambda is on one line of its own.
SYNCING = {
    "item": (lambda x, m, r: x[0].item(), "_local_scalar_dense"),
    "bool": (lambda x, m, r: bool(x[1] > 0), "_local_scalar_dense"),
    "int": (lambda x, m, r: int(x[1]), "_local_scalar_dense"),
    "if": (lambda x, m, r: 1 if x.sum() else 0, "_local_scalar_dense"),
    "tolist": (lambda x, m, r: x.tolist(), "tolist"),
    "numpy": (lambda x, m, r: x.numpy(), "numpy"),
    "cpu": (lambda x, m, r: x.cpu(), "cpu"),
    "to_cpu": (lambda x, m, r: x.to("cpu"), "to"),
    "nonzero": (lambda x, m, r: torch.nonzero(m), "nonzero"),
    "where": (lambda x, m, r: torch.where(m), "nonzero"),
    "masked_select": (lambda x, m, r: torch.masked_select(x, m), "masked_select"),
    "bool_index": (lambda x, m, r: x[m], "index"),
    "bool_index_put": (lambda x, m, r: x.clone().__setitem__(m, r[:4]), "index_put_"),
    "repeat_interleave": (lambda x, m, r: torch.repeat_interleave(x, r), "repeat_interleave"),
    "unique": (lambda x, m, r: torch.unique(r), "_unique2"),
    "unique_consecutive": (lambda x, m, r: torch.unique_consecutive(r), "unique_consecutive"),
    "equal": (lambda x, m, r: torch.equal(x, x), "equal"),
    "allclose": (lambda x, m, r: torch.allclose(x.float(), x.float()), "allclose"),
    "bincount": (lambda x, m, r: torch.bincount(r), "bincount"),
}
NOT_SYNCING = {
    "repeat_interleave_with_output_size":
        lambda x, m, r: torch.repeat_interleave(x, r, output_size=8),
    "repeat_interleave_int": lambda x, m, r: x.repeat_interleave(2),
    "index_with_int_tensor": lambda x, m, r: x[r],
    "masked_fill": lambda x, m, r: x.masked_fill(m, 0),
    "bool_index_put_of_a_scalar": lambda x, m, r: x.clone().__setitem__(m, 0),  # masked_fill_
    "to_same_device": lambda x, m, r: x.to(x.device),
    "where_three_args": lambda x, m, r: torch.where(m, x, 0),
    "to_same_dtype": lambda x, m, r: x.to(torch.float32),
    "arithmetic": lambda x, m, r: (x * 2 + r).sum(),
    "host_work_inside": lambda x, m, r: torch.tensor([3, 1, 2]).sort().values.tolist(),
}


def _line_of(fn) -> int:
    return inspect.getsourcelines(fn)[1]


@pytest.mark.parametrize("name", sorted(SYNCING))
def test_a_syncing_call_is_recorded_with_its_site(name):
    call, op = SYNCING[name]
    tensors = _device_tensors()  # made outside the guard: device memory
    syncs = host_syncs_of(lambda: call(*tensors), emulate=True)
    assert [(s.op, s.site) for s in syncs] == [(op, f"{HERE}:{_line_of(call)}")]


@pytest.mark.parametrize("name", sorted(NOT_SYNCING))
def test_a_call_that_does_not_sync_is_not_recorded(name):
    tensors = _device_tensors()
    assert host_syncs_of(lambda: NOT_SYNCING[name](*tensors), emulate=True) == []


def test_host_tensors_and_what_is_computed_from_them_are_read_freely():
    host = torch.tensor([0, 3, 7])
    with HostSyncGuard(emulate=True) as guard:
        guard.mark_host(host)
        lengths = host.diff()
        lengths.tolist(), int(lengths.sum()), torch.repeat_interleave(lengths)
    assert guard.syncs == []


def test_a_host_to_device_copy_stands_for_device_memory():
    with HostSyncGuard(emulate=True) as guard:
        host = torch.tensor([0, 3, 7])
        on_device = host_to_device(host, torch.device("cpu"))
        host.tolist()
        on_device.tolist()
    assert [s.op for s in guard.syncs] == ["tolist"]
    assert torch.equal(on_device, host) and on_device is not host
    # Outside a guard the copy is what it always was: the tensor itself.
    assert host_to_device(host, torch.device("cpu")) is host


def test_allowed_blocks_are_kept_apart():
    x, _, _ = _device_tensors()
    with HostSyncGuard(emulate=True) as guard:
        with guard.allowed():
            x.tolist()
        x[0].item()
    assert [s.op for s in guard.syncs] == ["_local_scalar_dense"]
    assert [s.op for s in guard.allowed_syncs] == ["tolist"]


def test_without_emulation_cpu_tensors_are_host_memory():
    # What the guard does on a GPU machine for CPU tensors: nothing to wait for.
    tensors = _device_tensors()
    assert host_syncs_of(lambda: SYNCING["item"][0](*tensors), emulate=False) == []


class _ReadingLayer(torch.nn.Module):
    """A layer that reads its input back (the bug the guard exists for)."""

    def __init__(self, read: str):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.read = read

    def forward(self, x, lengths):
        y = self.linear(x)
        if self.read == "item":
            y = y * y.abs().max().item()
        elif self.read == "repeat_interleave":
            y = y + torch.repeat_interleave(lengths, lengths)[: y.size(0), None]
        return y


@pytest.mark.parametrize("read", ["item", "repeat_interleave"])
def test_a_layer_that_reads_back_is_caught_in_forward_and_named(read):
    layer = _ReadingLayer(read)
    x, lengths = torch.randn(6, 4), torch.tensor([2, 1, 3])
    with HostSyncGuard(emulate=True) as guard:
        layer(x, lengths).sum().backward()
    assert [op for op, _, _ in guard.by_site()] == [
        "_local_scalar_dense" if read == "item" else "repeat_interleave"]
    source, first = inspect.getsourcelines(_ReadingLayer.forward)
    line = first + next(i for i, text in enumerate(source) if f'"{read}"' in text) + 1
    assert guard.by_site()[0][1] == f"{HERE}:{line}"
    assert guard.syncs[0].function == f"{HERE}:forward"  # what survives edits above the line
    with HostSyncGuard(emulate=True) as guard:
        _ReadingLayer("none")(x, lengths).sum().backward()
    assert guard.syncs == []


def test_dispatch_counts_name_the_op_and_the_site():
    x = torch.randn(3)
    with count_dispatches() as counts:
        for _ in range(3):
            x.add(1)  # one ATen call each
    line = _line_of(test_dispatch_counts_name_the_op_and_the_site) + 4
    assert counts == {("add", f"{HERE}:{line}"): 3}
