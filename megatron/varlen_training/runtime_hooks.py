"""What Megatron-LM's runtime flags do around the training steps (config/runtime.py), at the
points its ``train`` / ``train_step`` / ``evaluate`` do it:

- ``--manual-gc``: the automatic collector is off from the first step; a full collection then,
  at the end of every ``--manual-gc-interval``-th iteration (after its evaluation, before its
  checkpoint), and around each in-loop evaluation (full before, young generation after) unless
  ``--no-manual-gc-eval``. Every rank collects at the same
  iterations, so no rank stalls its peers with a collection of its own.
- ``--empty-unused-memory-level``: :func:`empty_unused_memory` at training.py's points.
- ``--profile``: torch.profiler over iterations [start, end) (``--use-pytorch-profiler``), or
  nsys's capture range over (start, end], on ``--profile-ranks``.
- ``--record-memory-history``: the CUDA allocator's history from start-up, a snapshot every
  ``--log-interval`` iterations (and after the first), on ``--profile-ranks``.

:class:`StepHooks` gathers them for the Trainer, which calls it around every step. An iteration
here is Megatron-LM's number: the n-th step trains iteration n (1-based).
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Callable, Iterator

import torch

from megatron.varlen_training import log
from megatron.varlen_training.config.runtime import RuntimeConfig

# The profiler's states in which stopping writes a trace (the window's steps).
_RECORDING = (torch.profiler.ProfilerAction.RECORD, torch.profiler.ProfilerAction.RECORD_AND_SAVE)
# Megatron-LM main's memory-history depth: the last 100k allocations and frees.
MEMORY_HISTORY_ENTRIES = 100_000
YOUNGEST_GENERATION = 0


def empty_unused_memory(runtime: RuntimeConfig, level: int) -> None:
    """``torch.cuda.empty_cache()`` where ``--empty-unused-memory-level`` reaches ``level``
    (1: after each forward-backward and evaluation batch; 2: also after each optimizer step).
    Without CUDA there is no cache and the call does nothing."""
    if runtime.empty_unused_memory_level >= level:
        torch.cuda.empty_cache()


class ManualGarbageCollection:
    """``--manual-gc`` (module docstring); nothing without it."""

    def __init__(self, runtime: RuntimeConfig):
        self.runtime = runtime
        self._was_enabled: bool | None = None

    def start(self) -> None:
        if self.runtime.manual_gc and self._was_enabled is None:
            self._was_enabled = gc.isenabled()
            gc.disable()
            gc.collect()

    def after_step(self, iteration: int) -> None:
        interval = self.runtime.manual_gc_interval
        if self.runtime.manual_gc and interval and iteration % interval == 0:
            gc.collect()

    @contextlib.contextmanager
    def around_evaluation(self) -> Iterator[None]:
        collect = self.runtime.manual_gc and self.runtime.manual_gc_eval
        if collect:
            gc.collect()
        yield
        if collect:  # only what the evaluation made and dropped
            gc.collect(generation=YOUNGEST_GENERATION)

    def close(self) -> None:
        """Gives the process its collector back (a test, or the facade's caller, goes on)."""
        if self._was_enabled:
            gc.enable()
        self._was_enabled = None


class TorchProfilerWindow:
    """torch.profiler over iterations [start, end) of this run, Megatron-LM's schedule (wait,
    one warm-up step, the window), its trace written under ``trace_dir`` by TensorBoard's
    handler as ``rank<r>.<time>.pt.trace.json``. ``step()`` runs before each step; a resumed
    run profiles what is left of the window. Profiler step k is the run's k-th step, so in a
    run from iteration 0 the trace's ``ProfilerStep#k`` is iteration k."""

    def __init__(self, start: int, end: int, trace_dir: str, rank: int):
        self.start, self.end, self.trace_dir, self.rank = start, end, trace_dir, rank
        self._profiler: torch.profiler.profile | None = None
        self._done = False

    def step(self, completed: int) -> None:
        if self._done:
            return
        if self._profiler is None:
            self._open(completed)
            if self._done:
                return
        self._profiler.step()

    def _open(self, completed: int) -> None:
        first = max(self.start, completed + 1)  # the first iteration still to profile
        if first >= self.end:
            log.info_all_ranks(f"> profiling: iterations {self.start} to {self.end - 1} are "
                               f"behind this run (it starts after iteration {completed})")
            self._done = True
            return
        self._profiler = torch.profiler.profile(
            schedule=torch.profiler.schedule(wait=first - completed - 1, warmup=1,
                                             active=self.end - first, repeat=1),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(
                self.trace_dir, worker_name=f"rank{self.rank}"),
            record_shapes=True, with_stack=True)  # core_v0.16.1 records both
        self._profiler.start()

    def after_step(self, completed: int) -> None:
        if self._profiler is not None and completed >= self.end - 1:
            self.close()  # stopping in the window's last step writes the trace

    def close(self) -> None:
        """Stops the profiler: within the window its trace is written (a run stopped early
        writes what it recorded); before it, nothing is."""
        if self._profiler is not None:
            recorded = self._profiler.current_action in _RECORDING
            self._profiler.stop()
            log.info_all_ranks(f"> profiling: torch.profiler trace written under {self.trace_dir}"
                               if recorded else f"> profiling: the run ended before iteration "
                                                f"{self.start}; no trace written")
        self._profiler, self._done = None, True


class NsysCaptureRange:
    """nsys's capture range (``nsys profile --capture-range=cudaProfilerApi``): opened before
    the step after iteration ``start``, closed after iteration ``end``, as Megatron-LM's
    cudaProfilerStart/Stop. ``open_range``/``close_range``: CUDA's (tests pass their own)."""

    def __init__(self, start: int, end: int, open_range: Callable[[], None] | None = None,
                 close_range: Callable[[], None] | None = None):
        self.start, self.end = start, end
        self._open_range = open_range or torch.cuda.profiler.start
        self._close_range = close_range or torch.cuda.profiler.stop
        self._open = False

    def step(self, completed: int) -> None:
        if completed == self.start:
            self._open_range()
            self._open = True

    def after_step(self, completed: int) -> None:
        if self._open and completed == self.end:
            self.close()

    def close(self) -> None:
        if self._open:
            self._close_range()
        self._open = False


class MemoryHistory:
    """``--record-memory-history`` on this rank: recording from :meth:`start` (before the model
    is built), a snapshot ``<stem>_<rank><suffix>`` every ``log_interval`` iterations and after
    the first step (Megatron-LM main's points and file names)."""

    def __init__(self, snapshot_path: str, rank: int, log_interval: int):
        stem, suffix = os.path.splitext(snapshot_path)
        self.path = f"{stem}_{rank}{suffix}"
        self.log_interval = log_interval
        self._first = True

    def start(self) -> None:
        torch.cuda.memory._record_memory_history(max_entries=MEMORY_HISTORY_ENTRIES)
        log.info_all_ranks(f"> recording CUDA memory history; snapshots go to {self.path}")

    def after_step(self, completed: int) -> None:
        if self._first or completed % self.log_interval == 0:
            torch.cuda.memory._dump_snapshot(self.path)
        self._first = False

    def close(self) -> None:
        torch.cuda.memory._record_memory_history(enabled=None)


class StepHooks:
    """The runtime flags' work around a run's steps, for the Trainer: :meth:`start` once before
    the model is built, :meth:`before_step` / :meth:`after_step` around each step (given the
    iterations completed), :meth:`around_evaluation` around each in-loop evaluation,
    :meth:`end_iteration` where Megatron-LM's loop ends an iteration (its
    ``post_training_step_callbacks``: after the iteration's evaluation, before its checkpoint;
    the profiler's stop and the interval's collection happen there), :meth:`close` at the end.
    An iteration the caller does not end (the facade's steps) ends before the next step or at
    :meth:`close`."""

    def __init__(self, runtime: RuntimeConfig, rank: int, log_interval: int,
                 tensorboard_dir: str | None):
        self.runtime = runtime
        self.gc = ManualGarbageCollection(runtime)
        profiled = runtime.profiles_rank(rank)
        self.profiler = _profiler(runtime, rank, tensorboard_dir) if profiled else None
        self.memory = (MemoryHistory(runtime.memory_snapshot_path, rank, log_interval)
                       if profiled and runtime.record_memory_history else None)
        self._unended: int | None = None  # the iteration stepped but not ended yet

    def start(self) -> None:
        if self.memory is not None:
            self.memory.start()

    def before_step(self, completed: int) -> None:
        self.end_iteration()
        self.gc.start()  # once: Megatron-LM turns the collector off as its loop begins
        if self.profiler is not None:
            self.profiler.step(completed)

    def after_step(self, completed: int) -> None:
        if self.memory is not None:  # Megatron-LM dumps while it logs the iteration
            self.memory.after_step(completed)
        self._unended = completed

    def around_evaluation(self):
        return self.gc.around_evaluation()

    def end_iteration(self) -> None:
        completed, self._unended = self._unended, None
        if completed is None:
            return
        if self.profiler is not None:
            self.profiler.after_step(completed)
        self.gc.after_step(completed)

    def close(self) -> None:
        self.end_iteration()
        for hook in (self.profiler, self.memory, self.gc):
            if hook is not None:
                hook.close()
        self.memory = None


def _profiler(runtime: RuntimeConfig, rank: int, tensorboard_dir: str | None):
    """The profiler ``--profile`` asks for on a profiled rank, or None."""
    if not runtime.profile:
        return None
    if runtime.use_pytorch_profiler:
        return TorchProfilerWindow(runtime.profile_step_start, runtime.profile_step_end,
                                   tensorboard_dir, rank)
    return NsysCaptureRange(runtime.profile_step_start, runtime.profile_step_end)
