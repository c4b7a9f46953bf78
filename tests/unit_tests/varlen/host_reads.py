"""Test tools that find device->host reads on a CPU-only machine.

On CUDA every call below copies device memory to the host and makes the host wait for the GPU (a
synchronisation); on CPU the same calls are free, and ``.cpu()`` of a CPU tensor is a no-op, so
the tests count CALLS, not copies:

* :class:`CountHostReads` (a ``TorchFunctionMode``) records every such call made inside it;
* :func:`device_only` marks a tensor as living on the device: any host read of it, or of
  anything computed from it, raises -- the data path's device boundaries, while the host copies
  attached beside them stay readable.
"""

from __future__ import annotations

import contextlib

import torch

# Calls that copy a (device) tensor to the host and so synchronise on CUDA.
HOST_READS = {
    torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.cpu, torch.Tensor.numpy,
    torch.Tensor.__bool__, torch.Tensor.__int__, torch.Tensor.__float__, torch.Tensor.__index__,
    torch.equal, torch.nonzero, torch.Tensor.nonzero, torch.masked_select,
    torch.Tensor.masked_select, torch.unique, torch.Tensor.unique,
}
# Reads only when the output size is data-dependent (a tensor of repeats, no output_size).
_REPEAT_INTERLEAVE = {torch.repeat_interleave, torch.Tensor.repeat_interleave}
_HOST = torch.device("cpu")


def _is_host_read(func, args: tuple, kwargs: dict) -> bool:
    if func in HOST_READS:
        return True
    if func in _REPEAT_INTERLEAVE:
        repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
        # torch.repeat_interleave(repeats) alone, or tensor repeats: the size is read back.
        return repeats is None or (isinstance(repeats, torch.Tensor)
                                   and kwargs.get("output_size") is None)
    if func is torch.Tensor.to:  # .to("cpu") / .to(torch.device("cpu")): a copy to the host
        targets = [*args[1:], kwargs.get("device")]
        return any(isinstance(t, (str, torch.device)) and torch.device(t) == _HOST
                   for t in targets)
    return False


def _name(func) -> str:
    return getattr(func, "__name__", str(func))


class CountHostReads(torch.overrides.TorchFunctionMode):
    """Records (in ``reads``) the name of every host-read call made inside the mode, except
    inside :meth:`exempt` blocks."""

    def __init__(self):
        super().__init__()
        self.reads: list[str] = []
        self._exempt = False

    @contextlib.contextmanager
    def exempt(self):
        """Calls in this block are not recorded (e.g. a kernel's CPU twin, which reads what
        the CUDA kernel keeps on the device)."""
        self._exempt = True
        try:
            yield
        finally:
            self._exempt = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self._exempt and _is_host_read(func, args, kwargs):
            self.reads.append(_name(func))
        return func(*args, **kwargs)


class _DeviceOnly(torch.Tensor):
    """A tensor that stands for device memory: host reads of it (or of results computed from
    it: they stay ``_DeviceOnly``) raise."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _is_host_read(func, args, kwargs):
            raise AssertionError(f"{_name(func)} read device-side boundaries back to the host")
        return super().__torch_function__(func, types, args, kwargs)


def device_only(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as a :class:`_DeviceOnly` tensor (same values, no copy)."""
    return tensor.as_subclass(_DeviceOnly)
