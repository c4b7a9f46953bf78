"""Counting and locating the points where the host waits for a CUDA device.

Two instruments, used by the GPU benchmark, the GPU check and the GPU tests:

* :func:`profiled_sync_events` counts the profiler's synchronising events (device->host copies,
  ``cuda*Synchronize`` calls) in a region, MINUS those of an empty profiled region: torch's
  profiler synchronises the device itself when it stops (torch 2.11's ``autograd/profiler.py``),
  so every profile holds at least one such event that is not the region's.
* :func:`sync_sites` runs a region under ``torch.cuda.set_sync_debug_mode("warn")`` and returns
  where each synchronising call was made (``file:line`` of the innermost frame outside torch,
  with a count), so a nonzero count comes with the code to look at. A warning raised with no
  frame of the region on the stack is the instrument's own (seen on torch 2.11: one per call,
  with only :func:`sync_sites` itself below the caller) and is not counted.

Both need CUDA; :func:`count_sync_events` is pure (CPU-tested).
"""

from __future__ import annotations

import collections
import traceback
import warnings

# Profiler event names that mean "the host waited for the device".
SYNC_EVENT_FRAGMENTS = ("Memcpy DtoH", "cudaStreamSynchronize", "cudaDeviceSynchronize",
                        "cudaEventSynchronize")
# Frames inside these paths are torch's own: a site is the first frame outside them.
_LIBRARY_FRAGMENTS = ("/torch/", "/contextlib.py", "/warnings.py", "sync_probe.py")


def count_sync_events(event_names) -> int:
    """Profiler events that make the host wait for the device (D2H copies, synchronize calls)."""
    return sum(1 for name in event_names if any(f in name for f in SYNC_EVENT_FRAGMENTS))


def _profiled_events(fn) -> list[str]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()  # no synchronize in here: it would count itself
    return [event.name for event in prof.events()]


def profiled_sync_events(fn) -> dict:
    """{"events": synchronising events in ``fn`` beyond an empty region's, "baseline": the empty
    region's own count, "names": the sync event names seen in ``fn``'s profile}."""
    baseline = count_sync_events(_profiled_events(lambda: None))
    names = [n for n in _profiled_events(fn) if count_sync_events([n])]
    return {"events": max(0, len(names) - baseline), "baseline": baseline, "names": names}


def _own_frames(stack) -> list:
    return [f for f in stack if not any(part in f.filename for part in _LIBRARY_FRAGMENTS)]


def _site(frame) -> str:
    from megatron.varlen.platform.host_syncs import short_path  # torch: imported when used

    return f"{short_path(frame.filename)}:{frame.lineno}"


def _region_frames(stack) -> list:
    """The frames called from inside :func:`sync_sites` (the region), innermost last."""
    inside = [i for i, frame in enumerate(stack)
              if frame.name == "sync_sites" and frame.filename.endswith("sync_probe.py")]
    return stack[inside[-1] + 1:] if inside else stack


def sync_sites(fn) -> list[tuple[str, int]]:
    """[(file:line, count)] of the synchronising calls ``fn`` makes, most frequent first."""
    import torch

    sites: collections.Counter = collections.Counter()

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchronizing" not in str(message).lower():
            return
        own = _own_frames(_region_frames(traceback.extract_stack()[:-1]))
        if own:  # else: raised with none of the region's code on the stack (the instrument's)
            sites[_site(own[-1])] += 1

    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return sites.most_common()
