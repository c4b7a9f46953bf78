"""CPU device layer: lets megatron-core's CUDA-minded machinery run on CPU with gloo.

megatron-core 0.16.1 hard-codes CUDA in places no config flag reaches (tensor allocations with
``device=torch.cuda.current_device()``, ``.cuda()`` calls in the pipeline schedules and p2p
buffers, CUDA RNG states, ``param.type()`` string checks in grad clipping). When CUDA is absent,
:func:`activate` installs the smallest set of redirects that makes that code run unchanged:

1. ``_CudaToCpuMode`` -- a ``TorchFunctionMode`` that rewrites CUDA device arguments to CPU and
   turns ``Tensor.cuda()`` / ``Tensor.pin_memory()`` into no-ops on CPU tensors.
2. ``torch.cuda`` helpers that would raise without a driver (``current_device``,
   ``synchronize``, ``device_count``...) answer as a single CPU "device"; ``current_device()``
   is the CPU device itself, because autograd backward runs without torch function modes.
3. ``CpuRNGStatesTracker`` -- megatron's RNG tracker API on the CPU generator, so dropout in
   TP regions stays reproducible and TP ranks draw from their own named streams; activation
   recomputation (``tensor_parallel.checkpoint``) saves and restores the CPU generator only.
4. ``Tensor.type()`` (no argument) reports CPU tensors under their CUDA type name: the
   optimizers and grad clipping dispatch on strings like ``'torch.cuda.FloatTensor'``.

Everything is a no-op when CUDA is available: on GPU the same code runs on the real device,
unless the process chose CPU explicitly with :func:`force_cpu` (what the multi-rank test
harness does for CPU-designed tests on a machine with a GPU): then the redirects are installed
anyway and ``torch.cuda.is_available()`` answers False, so no code path initialises CUDA.
Each redirect is named below and covered by tests/unit_tests/varlen/test_cpu_device.py.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_ACTIVE_MODE: "_CudaToCpuMode | None" = None
# Set by force_cpu(): this process runs on CPU whatever CUDA devices are visible.
_FORCED_CPU = False
_PATCHED: dict[tuple[Any, str], Any] = {}

# Tensor methods whose device argument is positional (tensor.to("cuda"), tensor.cuda(0)...).
_DEVICE_KWARG = "device"
_PIN_MEMORY_KWARG = "pin_memory"
_CPU = torch.device("cpu")
_CPU_TYPE_PREFIX = "torch."
_CUDA_TYPE_PREFIX = "torch.cuda."
_NO_CUDA_RNG_STATE = torch.empty(0, dtype=torch.uint8)


def _cuda_visible() -> bool:
    """CUDA availability as torch reports it, even while is_available() is redirected."""
    return _PATCHED.get((torch.cuda, "is_available"), torch.cuda.is_available)()


def force_cpu() -> None:
    """Choose CPU for this process even when CUDA is visible (call before :func:`activate`).

    The multi-rank harness calls it for CPU-designed tests: the device is then an explicit
    choice, not an accident of what the machine has.
    """
    global _FORCED_CPU
    _FORCED_CPU = True


def use_cpu() -> bool:
    """True when training must run on CPU: no CUDA device visible, or CPU forced."""
    return _FORCED_CPU or not _cuda_visible()


def get_device() -> torch.device:
    """The device the training path puts tensors on: the current CUDA device, else CPU."""
    if use_cpu():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def get_backend() -> str:
    """The torch.distributed backend matching :func:`get_device`."""
    return "gloo" if use_cpu() else "nccl"


def _is_cuda_device(device: Any) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    # A bare int is a CUDA ordinal in torch's conventions (torch.empty(3, device=0)).
    return isinstance(device, int) and not isinstance(device, bool)


def _redirect(device: Any) -> Any:
    return torch.device("cpu") if _is_cuda_device(device) else device


def _cuda_type_name(tensor: torch.Tensor) -> str:
    with torch._C.DisableTorchFunction():
        name = tensor.type()
    if tensor.device.type == "cpu" and name.startswith(_CPU_TYPE_PREFIX):
        return _CUDA_TYPE_PREFIX + name[len(_CPU_TYPE_PREFIX):]
    return name


class _CudaToCpuMode(TorchFunctionMode):
    """Maps every CUDA placement request to CPU.

    Covers factory functions (``torch.empty(..., device="cuda")``), ``Tensor.to(...)`` with a
    CUDA device given positionally or by keyword, ``Tensor.cuda()`` and ``Tensor.pin_memory()``
    and ``pin_memory=True`` factory arguments (pinned host memory needs a CUDA driver; on CPU it
    is just the tensor), and the type-string
    query ``Tensor.type()``.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda or func is torch.Tensor.pin_memory:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            return _cuda_type_name(args[0])
        if _DEVICE_KWARG in kwargs:
            kwargs[_DEVICE_KWARG] = _redirect(kwargs[_DEVICE_KWARG])
        if kwargs.get(_PIN_MEMORY_KWARG):
            kwargs[_PIN_MEMORY_KWARG] = False  # e.g. torch.tensor(..., pin_memory=True) in RoPE
        if func is torch.Tensor.to and len(args) > 1:
            args = (args[0], _redirect(args[1])) + tuple(args[2:])
        return func(*args, **kwargs)




class CpuRNGStatesTracker:
    """megatron's ``CudaRNGStatesTracker`` API backed by the CPU generator.

    ``add(name, seed)`` records a named generator state; ``fork(name)`` swaps it in for the
    duration of a block (e.g. dropout inside a TP region) and stores the advanced state when the
    block ends, exactly like the CUDA tracker does for CUDA states.
    """

    def __init__(self, *args, **kwargs):
        del args, kwargs  # accepts the CUDA tracker's constructor arguments and ignores them
        self.reset()

    def is_initialized(self) -> bool:
        return self._is_initialized

    def reset(self) -> None:
        self._is_initialized = False
        self.states_: dict[str, torch.Tensor] = {}
        self.seeds_: set[int] = set()

    def get_states(self) -> dict[str, torch.Tensor]:
        return dict(self.states_)

    def set_states(self, states: dict[str, torch.Tensor]) -> None:
        self._is_initialized = True
        self.states_ = dict(states)

    def add(self, name: str, seed: int) -> None:
        self._is_initialized = True
        if seed in self.seeds_:
            raise ValueError(f"RNG seed {seed} is already used by another tracked state")
        if name in self.states_:
            raise ValueError(f"RNG state {name!r} already exists")
        self.seeds_.add(seed)
        generator = torch.Generator().manual_seed(seed)
        self.states_[name] = generator.get_state()

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng"):
        if name not in self.states_:
            raise KeyError(f"RNG state {name!r} was never added to the tracker")
        outer_state = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(outer_state)


def _patch(owner: Any, attr: str, value: Any) -> None:
    key = (owner, attr)
    if key not in _PATCHED:
        _PATCHED[key] = getattr(owner, attr)
    setattr(owner, attr, value)


class _CpuEvent:
    """Stands in for a ``torch.cuda.Event``: CPU work is already complete when recorded."""

    def __init__(self, *args, **kwargs):
        pass

    def synchronize(self) -> None:
        return None

    def wait(self, stream=None) -> None:
        return None

    def query(self) -> bool:
        return True


class _CpuStream:
    """Stands in for a ``torch.cuda.Stream`` (megatron-core's MoE all-to-all dispatcher makes a
    side stream for its device-to-host copies): one stream, CPU work runs in program order.
    A class, so annotations such as ``torch.cuda.Stream | None`` (transformers) still work;
    constructing it gives the one instance."""

    _instance = None

    def __new__(cls, *args, **kwargs):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def wait_stream(self, stream) -> None:
        return None

    def record_event(self, event=None) -> _CpuEvent:
        return event or _CpuEvent()

    def synchronize(self) -> None:
        return None


_CPU_STREAM = _CpuStream()


def _patch_torch_cuda() -> None:
    """torch.cuda queries that raise without a driver answer as one CPU device.

    ``current_device()`` returns the CPU device itself rather than ordinal 0: megatron-core
    passes it straight to ``device=`` and ``.to()``, also inside ``autograd.Function.backward``
    (sequence-parallel reduce-scatter buffers), where torch function modes are NOT active, so
    only an answer that is already CPU works there.
    """
    _patch(torch.cuda, "current_device", lambda: _CPU)
    _patch(torch.cuda, "device_count", lambda: 1)
    _patch(torch.cuda, "synchronize", lambda *a, **k: None)
    _patch(torch.cuda, "set_device", lambda *a, **k: None)
    _patch(torch.cuda, "empty_cache", lambda *a, **k: None)
    _patch(torch.cuda, "manual_seed", lambda seed: None)
    _patch(torch.cuda, "manual_seed_all", lambda seed: None)
    # Streams: the one CPU "stream" is every stream, so no side-stream bookkeeping happens.
    _patch(torch.cuda, "Stream", _CpuStream)
    _patch(torch.cuda, "current_stream", lambda *a, **k: _CPU_STREAM)
    _patch(torch.cuda, "stream", lambda *a, **k: contextlib.nullcontext())
    _patch(torch.cuda, "Event", _CpuEvent)
    if _FORCED_CPU:  # a GPU is visible but not ours: everything that asks must hear "no CUDA"
        _patch(torch.cuda, "is_available", lambda: False)


def _patch_rng_tracker() -> None:
    """Megatron's RNG tracker becomes the CPU tracker (both the class and the live instance)."""
    from megatron.core.tensor_parallel import random as mcore_random

    _patch(mcore_random, "CudaRNGStatesTracker", CpuRNGStatesTracker)
    _patch(mcore_random, "_CUDA_RNG_STATE_TRACKER", CpuRNGStatesTracker())
    _patch(mcore_random, "_CUDA_RNG_STATE_TRACKER_INITIALIZED", True)
    _patch(mcore_random, "initialize_rng_tracker", lambda *a, **k: None)
    # Activation recomputation (tensor_parallel.checkpoint) saves and restores the "CUDA"
    # generator beside the CPU one; on CPU there is only the CPU generator, which it restores
    # anyway, so the CUDA state is an empty placeholder and setting it does nothing.
    _patch(mcore_random, "_get_cuda_rng_state", lambda *a, **k: _NO_CUDA_RNG_STATE)
    _patch(mcore_random, "_set_cuda_rng_state", lambda *a, **k: None)


def _patch_moe_host_copies() -> None:
    """megatron-core's MoE all-to-all dispatcher copies its split sizes to the host as numpy
    arrays (what ``all_to_all_single`` takes) only when they are CUDA tensors; on CPU they would
    stay tensors, which it refuses. The copy runs in forward and backward (where torch function
    modes are not active), so the dispatcher's helper itself is replaced."""
    from megatron.core.transformer.moe import token_dispatcher

    original = token_dispatcher.maybe_move_tensor_to_cpu

    def host_copy(tensor, as_numpy: bool = False, record_stream: bool = False):
        if torch.is_tensor(tensor) and as_numpy:
            return tensor.detach().cpu().numpy()
        return original(tensor, as_numpy=as_numpy, record_stream=record_stream)

    _patch(token_dispatcher, "maybe_move_tensor_to_cpu", host_copy)


def _uneven_gather_along_first_dim(original):
    """gloo's all_gather needs equal sizes; megatron-core's MoE dispatcher gathers each TP
    rank's routed tokens (different counts) with ``output_split_sizes``: pad, gather, cut."""

    def gather(input_, group, output_split_sizes=None, use_global_buffer=False):
        if output_split_sizes is None or group.size() == 1:
            return original(input_, group, output_split_sizes, use_global_buffer)
        sizes = [int(size) for size in output_split_sizes]
        padded = input_.new_zeros((max(sizes),) + tuple(input_.shape[1:]))
        padded[: input_.shape[0]] = input_
        parts = [torch.empty_like(padded) for _ in sizes]
        torch.distributed.all_gather(parts, padded, group=group)
        return torch.cat([part[:size] for part, size in zip(parts, sizes)])

    return gather


def _uneven_reduce_scatter_along_first_dim(original):
    """The backward of :func:`_uneven_gather_along_first_dim`'s gather (``input_split_sizes``):
    sum over the group, keep this rank's rows (gloo has no uneven reduce-scatter)."""

    def reduce_scatter(input_, group, input_split_sizes=None, use_global_buffer=False):
        if input_split_sizes is None or group.size() == 1:
            return original(input_, group, input_split_sizes, use_global_buffer)
        sizes = [int(size) for size in input_split_sizes]
        total = input_.contiguous().clone()
        torch.distributed.all_reduce(total, group=group)
        start = sum(sizes[: group.rank()])
        return total[start: start + sizes[group.rank()]].clone()

    return reduce_scatter


def _patch_uneven_sequence_collectives() -> None:
    """Uneven gathers and reduce-scatters over TP (MoE with TP and the all-to-all dispatcher);
    they run in forward and backward, so megatron-core's helpers themselves are replaced."""
    from megatron.core.tensor_parallel import mappings

    _patch(mappings, "_gather_along_first_dim",
           _uneven_gather_along_first_dim(mappings._gather_along_first_dim))
    _patch(mappings, "_reduce_scatter_along_first_dim",
           _uneven_reduce_scatter_along_first_dim(mappings._reduce_scatter_along_first_dim))


def activate() -> bool:
    """Installs the CPU redirects once per process; returns True if they are active.

    Safe to call repeatedly. Does nothing (and returns False) when CUDA is available and CPU
    was not forced (:func:`force_cpu`).
    """
    global _ACTIVE_MODE
    if not use_cpu():
        return False
    if _ACTIVE_MODE is None:
        _patch_torch_cuda()
        _patch_rng_tracker()
        _patch_moe_host_copies()
        _patch_uneven_sequence_collectives()
        _ACTIVE_MODE = _CudaToCpuMode()
        _ACTIVE_MODE.__enter__()
    return True


def deactivate() -> None:
    """Removes every redirect and the forced-CPU choice (used by tests of this module)."""
    global _ACTIVE_MODE, _FORCED_CPU
    _FORCED_CPU = False
    if _ACTIVE_MODE is not None:
        _ACTIVE_MODE.__exit__(None, None, None)
        _ACTIVE_MODE = None
    for (owner, attr), value in reversed(list(_PATCHED.items())):
        setattr(owner, attr, value)
    _PATCHED.clear()
