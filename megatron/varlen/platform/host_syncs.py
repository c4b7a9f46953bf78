"""Finding the operations that make the host wait for the device, on CPU as on CUDA.

:class:`HostSyncGuard` records, with the Python ``file:line`` that made it, every operation that
on CUDA copies device memory to the host and so blocks the host until the device catches up
(a host sync). It sees ATen operations (a ``TorchDispatchMode``), so it also finds them inside
megatron-core and torch's own Python code:

* ``aten._local_scalar_dense``: ``.item()``, ``bool()``, ``int()``, ``float()`` of a tensor,
  ``if tensor:``;
* ops whose output size depends on the data: ``nonzero`` (``torch.where(mask)``, ``argwhere``),
  ``masked_select``, indexing or index assignment with a boolean mask, ``unique*``,
  ``bincount``, ``repeat_interleave`` with tensor repeats and no ``output_size``;
* ops that answer a host bool: ``equal``, ``allclose``;
* copies to the host: ``.cpu()``, ``.to("cpu")``, ``.tolist()``, ``.numpy()`` of a device tensor.

What is a device tensor. On CUDA: any tensor not on the CPU. On CPU (``emulate=True``, the
default where CUDA is absent) every tensor stands for device memory except the HOST tensors:
those the caller marks (:meth:`HostSyncGuard.mark_host`, e.g. the host copies of the boundaries
the data path attaches) and everything computed inside the guard from host tensors only, or made
there by a factory (``torch.tensor(list)``, ``torch.arange``; on a GPU those default to the
host too). A host tensor that :func:`~megatron.varlen.packing.packed_seq.host_to_device` moves
becomes a device tensor (:func:`as_device_copy`). ``.cpu()``/``.tolist()``/``.numpy()`` of a
CPU tensor make no ATen call, so a ``TorchFunctionMode`` twin of the guard records those.

What a CPU run cannot show: a factory call with an explicit ``device=`` (counted as host);
ATen copies between CPU tensors (every device is "cpu": only ``.cpu()``, ``.tolist()``,
``.numpy()`` and ``.to("cpu")`` with a literal ``"cpu"`` count); code that takes another path
when ``tensor.is_cuda`` (megatron-core's MoE dispatcher moves its counts to the host only then);
waits that are no ATen op (``Event.synchronize``, ``torch.cuda.synchronize``). It counts calls,
not their cost. On a GPU (``emulate=False``) the devices are real and only the last two remain:
``tools/sync_probe.py`` (torch's sync debug mode, the profiler) covers them.

:class:`DispatchCounts` is the other instrument: every ATen operation of a region counted by
phase, operation and site, the host's work per step (tools/host_work.py prints it).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import sys
import sysconfig
from typing import Callable, Iterator, Optional

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

_aten = torch.ops.aten
# Always a host sync on CUDA: the host reads the result (or its size) before it can go on.
SYNC_OPS = frozenset({
    _aten._local_scalar_dense.default, _aten.nonzero.default, _aten.masked_select.default,
    _aten.equal.default, _aten.allclose.default, _aten.bincount.default,
    _aten._unique.default, _aten._unique2.default, _aten.unique_dim.default,
    _aten.unique_consecutive.default, _aten.unique_dim_consecutive.default,
})
# A sync only without the output size: the host would have to read sum(repeats).
_REPEAT_INTERLEAVE = _aten.repeat_interleave.Tensor
# A sync only with a boolean index: it becomes nonzero inside the op.
_INDEX_OPS = frozenset({_aten.index.Tensor, _aten.index_put.default, _aten.index_put_.default,
                        _aten._index_put_impl_.default})
# Copies that land on the host when their input is on the device.
_COPY_OPS = frozenset({_aten._to_copy.default, _aten.copy_.default})
# torch.tensor(data) hands its freshly made CPU tensor to these: a factory, like arange.
_LIFTS = frozenset({_aten.lift_fresh.default, _aten.lift_fresh_copy.default})
# Python-level host reads that make no ATen call when the tensor is already on the CPU.
_FUNCTION_READS = {torch.Tensor.tolist: "tolist", torch.Tensor.numpy: "numpy",
                   torch.Tensor.cpu: "cpu", torch.Tensor.to: "to"}
_HOST = torch.device("cpu")
# Frames in these files are torch's or this instrument's: a site is the first frame outside.
_LIBRARY_PATHS = (os.path.dirname(torch.__file__) + os.sep,
                  sysconfig.get_paths()["stdlib"] + os.sep, os.path.abspath(__file__))
# A torch mode's handler only passes the call on: the caller's frame is the site.
_MODE_HANDLERS = frozenset({"__torch_function__", "__torch_dispatch__"})
# Where a path is shortened for display (the part after the marker is kept).
_PATH_MARKERS = ("site-packages/", "/megatron/", "/tools/", "/tests/")

_active: list["HostSyncGuard"] = []  # guards in effect, innermost last


@dataclasses.dataclass(frozen=True)
class HostSync:
    """One recorded host sync: the ATen (or Python) operation, where it was called, and the
    guard's phase then (see :meth:`HostSyncGuard.phase`)."""

    op: str
    site: str           # file:line
    phase: str = ""
    function: str = ""  # file:function, for lists that must survive edits above the line


def short_path(path: str) -> str:
    """``path`` from the package root on (``megatron/...``, ``torch/...``, ``tools/...``)."""
    for marker in _PATH_MARKERS:
        if marker in path:
            keep_marker = not marker.endswith("site-packages/")
            return path[path.index(marker) + (1 if keep_marker else len(marker)):]
    return path


def _is_library_frame(frame, skip: tuple[str, ...]) -> bool:
    code = frame.f_code
    return code.co_filename.startswith(skip) or code.co_name in _MODE_HANDLERS


def _site_frame(skip: tuple[str, ...]):
    frame = sys._getframe(2)
    while frame is not None and _is_library_frame(frame, skip):
        frame = frame.f_back
    return frame


def call_site(skip: tuple[str, ...] = _LIBRARY_PATHS) -> str:
    """``file:line`` of the innermost Python frame outside torch, the standard library, this
    module and any torch mode's handler (e.g. the CPU device layer's)."""
    frame = _site_frame(skip)
    if frame is None:
        return "?"
    return f"{short_path(frame.f_code.co_filename)}:{frame.f_lineno}"


def call_function(skip: tuple[str, ...] = _LIBRARY_PATHS) -> str:
    """``file:function`` of :func:`call_site`'s frame (stable where line numbers move)."""
    frame = _site_frame(skip)
    if frame is None:
        return "?"
    return f"{short_path(frame.f_code.co_filename)}:{frame.f_code.co_name}"


def _tensors(values) -> Iterator[torch.Tensor]:
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from _tensors(value)


def _bool_index(op_args) -> bool:
    indices = op_args[1] if len(op_args) > 1 else ()
    return any(t.dtype in (torch.bool, torch.uint8) for t in _tensors(indices or ()))


def _is_masked_fill(func, args, kwargs, is_host) -> bool:
    """``x[mask] = scalar``: index_put_ with one boolean mask and a one-element host value runs
    as ``masked_fill_`` (ATen's canDispatchToMaskedFill): no nonzero, no sync."""
    if func is _aten.index.Tensor or len(args) < 3:
        return False
    accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
    indices = [t for t in args[1] if t is not None]
    value = args[2]
    return (not accumulate and len(indices) == 1 and value.numel() == 1
            and is_host(value))


def _is_device_to_host_copy(func, args, kwargs) -> bool:
    """A copy from a real device (not the CPU) to the host. Between CPU tensors (a CPU run
    standing in for one) it is ambiguous, as every device there is "cpu": the
    Python-level recorder sees ``.cpu()``/``.tolist()``/``.numpy()``/``.to("cpu")`` instead."""
    if func is _aten._to_copy.default:
        source, target = args[0], kwargs.get("device")
    else:
        target, source = args[0].device, args[1]
    return source.device != _HOST and _is_host_device(target)


def _is_host_device(device) -> bool:
    return device is not None and torch.device(device) == _HOST


class _DispatchRecorder(TorchDispatchMode):
    def __init__(self, guard: "HostSyncGuard"):
        super().__init__()
        self.guard = guard

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = list(_tensors(list(args) + list(kwargs.values())))
        if self.guard.is_sync(func, args, kwargs, inputs):
            self.guard.record(str(func.overloadpacket.__name__))
        out = func(*args, **kwargs)
        outputs = _tensors(out if isinstance(out, (list, tuple)) else [out])
        if func in _LIFTS or all(self.guard.is_host(t) for t in inputs):  # factories too
            self.guard.mark_host(*outputs)
        else:  # device work; an in-place op turns a host tensor into device memory
            for tensor in outputs:
                self.guard.mark_device(tensor)
        return out


class _FunctionRecorder(TorchFunctionMode):
    """``.cpu()``/``.tolist()``/``.numpy()``/``.to("cpu")`` of a CPU tensor that stands for
    device memory: no ATen call to see (on CUDA the dispatch recorder sees the copy)."""

    def __init__(self, guard: "HostSyncGuard"):
        super().__init__()
        self.guard = guard

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _FUNCTION_READS.get(func)
        if name and args and isinstance(args[0], torch.Tensor) and self._reads(name, args,
                                                                               kwargs):
            self.guard.record(name)
        return func(*args, **kwargs)

    def _reads(self, name, args, kwargs) -> bool:
        tensor = args[0]
        if tensor.device != _HOST or self.guard.is_host(tensor):
            return False  # a CUDA tensor's copy is an ATen _to_copy: recorded there
        if name != "to":
            return True
        # Only a literal "cpu" names the host: on CPU, device=x.device is "cpu" for any x.
        return any(isinstance(t, str) and _is_host_device(t)
                   for t in [*args[1:], kwargs.get("device")])


@contextlib.contextmanager
def _phase_of(recorder, name: str) -> Iterator[None]:
    """Inside the block, ``recorder._phase`` is ``name``; the outer phase comes back after."""
    outer, recorder._phase = recorder._phase, name
    try:
        yield
    finally:
        recorder._phase = outer


class HostSyncGuard:
    """Records the host syncs made inside ``with guard:`` (see the module docstring).

    Args:
        emulate: treat CPU tensors as device memory unless they are host tensors (default:
            when CUDA is not available).

    ``guard.syncs`` lists them in order; :meth:`by_site` counts them; :meth:`allowed` is a
    block whose syncs are kept apart (``guard.allowed_syncs``), e.g. a kernel's CPU twin.
    """

    def __init__(self, emulate: Optional[bool] = None):
        self.emulate = (not torch.cuda.is_available()) if emulate is None else emulate
        self.syncs: list[HostSync] = []
        self.allowed_syncs: list[HostSync] = []
        self._host = WeakIdKeyDictionary()
        self._allowed_depth = 0
        self._phase = ""
        self._modes: list = []

    def is_host(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` is host memory (reading it is no sync)."""
        if tensor.device != _HOST:
            return False
        return not self.emulate or tensor in self._host

    def mark_host(self, *tensors: Optional[torch.Tensor]) -> None:
        """Declares ``tensors`` host memory (e.g. the data path's host copies)."""
        for tensor in tensors:
            if tensor is not None and tensor.device == _HOST:
                self._host[tensor] = True

    def mark_device(self, tensor: torch.Tensor) -> None:
        """Declares ``tensor`` device memory (the result of a host->device copy)."""
        self._host.pop(tensor, None)

    def is_sync(self, func, args, kwargs, inputs) -> bool:
        """Whether ATen ``func`` on these arguments makes the host wait for the device."""
        if not inputs or all(self.is_host(t) for t in inputs):
            return False  # host work: no device to wait for
        if func in SYNC_OPS:
            return True
        if func is _REPEAT_INTERLEAVE:
            return kwargs.get("output_size") is None
        if func in _INDEX_OPS:
            return _bool_index(args) and not _is_masked_fill(func, args, kwargs, self.is_host)
        if func in _COPY_OPS:
            return _is_device_to_host_copy(func, args, kwargs)
        return False

    def record(self, op: str) -> None:
        entry = HostSync(op, call_site(), self._phase, call_function())
        (self.allowed_syncs if self._allowed_depth else self.syncs).append(entry)

    @contextlib.contextmanager
    def allowed(self) -> Iterator[None]:
        """Syncs inside this block go to ``allowed_syncs``, not ``syncs``."""
        self._allowed_depth += 1
        try:
            yield
        finally:
            self._allowed_depth -= 1

    def phase(self, name: str) -> contextlib.AbstractContextManager:
        """Syncs inside this block are tagged ``name`` (e.g. forward, backward, optimizer)."""
        return _phase_of(self, name)

    def by_site(self, phase: Optional[str] = None) -> list[tuple[str, str, int]]:
        """[(op, site, count)] of ``syncs`` (of one ``phase``: all when None), most frequent
        first."""
        counts = collections.Counter((s.op, s.site) for s in self.syncs
                                     if phase is None or s.phase == phase)
        return [(op, site, n) for (op, site), n in counts.most_common()]

    def __enter__(self) -> "HostSyncGuard":
        self._modes = [_FunctionRecorder(self), _DispatchRecorder(self)]
        for mode in self._modes:
            mode.__enter__()
        _active.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _active.remove(self)
        for mode in reversed(self._modes):
            mode.__exit__(*exc)
        self._modes = []


def as_device_copy(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """What a host->device copy returns when the active guard emulates a device on CPU: a
    distinct tensor (same values) that counts as device memory; otherwise ``tensor`` itself.
    Called by :func:`~megatron.varlen.packing.packed_seq.host_to_device` (one branch, only
    while a guard is active), so that the CPU stand-in of a device copy is one."""
    if not _active or not _active[-1].emulate or device != _HOST:
        return tensor
    guard = _active[-1]
    copy = tensor.clone()
    guard.mark_device(copy)
    return copy


def host_syncs_of(fn: Callable[[], object], emulate: Optional[bool] = None) -> list[HostSync]:
    """The host syncs ``fn()`` makes (a fresh :class:`HostSyncGuard`)."""
    with HostSyncGuard(emulate) as guard:
        fn()
    return guard.syncs


def autograd_site() -> str:
    """:func:`call_site`, or inside a backward pass the autograd node that runs (the Python
    frame there is only the ``backward()`` call): ``backward:<node name>``."""
    node = torch._C._current_autograd_node()
    return call_site() if node is None else f"backward:{node.name()}"


class DispatchCounts(TorchDispatchMode):
    """Counts every ATen operation dispatched inside ``with counts:`` by (phase, op name,
    site): the host's work, each one operator call (on CUDA usually one or more kernel
    launches). Sites are :func:`autograd_site`'s; ``counts.table`` holds the counts."""

    def __init__(self, site: Callable[[], str] = autograd_site):
        super().__init__()
        self.table: collections.Counter = collections.Counter()
        self._site = site
        self._phase = ""
        self._paused = 0

    def phase(self, name: str) -> contextlib.AbstractContextManager:
        """Operations inside this block count under phase ``name``."""
        return _phase_of(self, name)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Operations inside this block are not counted (e.g. a kernel's CPU twin: on CUDA one
        call, counted by the caller with :meth:`add`)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def add(self, op: str, count: int = 1) -> None:
        """Counts ``op`` at the caller's site, as if dispatched."""
        self.table[(self._phase, op, self._site())] += count

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self._paused:
            self.table[(self._phase, str(func.overloadpacket.__name__), self._site())] += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def count_dispatches() -> Iterator[collections.Counter]:
    """The :class:`DispatchCounts` table of the block, keyed by (op name, site) only."""
    counts: collections.Counter = collections.Counter()
    with DispatchCounts() as counter:
        yield counts
    for (_, op, site), n in counter.table.items():
        counts[(op, site)] += n
