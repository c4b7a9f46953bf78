"""Megatron-LM's progress log (``--log-progress``): ``progress.txt`` in the ``--save`` folder,
appended by global rank 0 across the jobs of a run, one tab-separated line per event, in
Megatron-LM core_v0.16.1's format (``append_to_progress_log``,
``compute_throughputs_and_append_to_progress_log``)::

    2026-11-27 05:31:14<TAB>Job ID: 4711<TAB># GPUs: 8<TAB>Starting job
    2026-11-27 06:02:51<TAB>Job ID: 4711<TAB># GPUs: 8<TAB>Saved checkpoint<TAB>Iteration: 500
    <TAB>Job throughput: 41.3 TFLOP/s/GPU<TAB>Cumulative throughput: 40.9 TFLOP/s/GPU
    <TAB>Floating-point operations: 1.49e+17<TAB>Tokens (in billions): 0.03

(the second line is one line in the file). The job id is ``$SLURM_JOB_ID`` (empty without it),
``# GPUs`` the world size. "Job throughput" divides the floating-point operations of this job
(since its load) by the time since it started; "Cumulative throughput" those since the first
job of the current world size, as the file itself records (its first "Starting job" line after
the last change of world size, and the operations of the last checkpoint saved before it).
The operations are this fork's count from the real sample lengths (flops.py), carried across
resumes in the checkpoints (Megatron-LM's ``num_floating_point_operations_so_far``); the tokens
are Megatron-LM's count, consumed samples x ``--seq-length`` (with variable-length samples the
slots they were cut to fit, not their real tokens: those are the JSONL record's ``tokens``).

Megatron-LM writes nothing without ``--save``, and so does this module. Its lines of
asynchronous saves and retained-checkpoint deletions have no counterpart here (``--async-save``
and ``--save-retain-interval`` are refused).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

import torch

from megatron.varlen_training.config import RunConfig
from megatron.varlen_training.errors import UserInputError, agree_on_errors

PROGRESS_FILENAME = "progress.txt"
TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S"
JOB_ID_VARIABLE = "SLURM_JOB_ID"
STARTING_JOB = "Starting job"
SAVED_CHECKPOINT = "Saved checkpoint"
TERA = 10 ** 12
BILLION = 10 ** 9
# Tab-separated fields of a line: timestamp, job id, world size, event, then the event's own.
_WORLD_SIZE_FIELD, _EVENT_FIELD, _FLOPS_FIELD = 2, 3, 7
_FIELD_SEPARATOR = ": "


def progress_line(now: datetime, job_id: str, world_size: int, event: str) -> str:
    """One line of progress.txt (with its newline), as Megatron-LM writes it."""
    return f"{now.strftime(TIMESTAMP_FORMAT)}\tJob ID: {job_id}\t# GPUs: {world_size}\t{event}\n"


def checkpoint_event(iteration: int, job_tflops: float, cumulative_tflops: float,
                     flops_so_far: int, tokens_so_far: int) -> str:
    """The event of a saved checkpoint, with Megatron-LM's field names and formats."""
    return (f"{SAVED_CHECKPOINT}\tIteration: {iteration}\t"
            f"Job throughput: {job_tflops:.1f} TFLOP/s/GPU\t"
            f"Cumulative throughput: {cumulative_tflops:.1f} TFLOP/s/GPU\t"
            f"Floating-point operations: {flops_so_far:.2e}\t"
            f"Tokens (in billions): {tokens_so_far / BILLION:.2f}")


def tflops_per_gpu(flops: float, seconds: float, world_size: int) -> float:
    """TFLOP/s per rank; 0 over no time (Megatron-LM would divide by zero)."""
    return flops / (seconds * TERA * world_size) if seconds > 0 else 0.0


def throughputs(flops_so_far: int, job_start: tuple[float, int],
                first_start: tuple[datetime, float], now: float,
                world_size: int) -> tuple[float, float]:
    """Megatron-LM's job and cumulative throughputs (TFLOP/s per rank) at ``now``
    (``time.time()``): the operations since this job's start ``job_start`` (its
    ``time.time()``, the operations it loaded) over its time, and those since ``first_start``
    (the first job of this world size in the log: its stamp, the operations then) over the
    time since that stamp."""
    started_at, flops_at_start = job_start
    first_stamp, first_flops = first_start
    job = tflops_per_gpu(flops_so_far - flops_at_start, now - started_at, world_size)
    elapsed = (datetime.fromtimestamp(now) - first_stamp).total_seconds()
    return job, tflops_per_gpu(flops_so_far - first_flops, elapsed, world_size)


def _field(text: str, kind):
    return kind(text.split(_FIELD_SEPARATOR, 1)[1])


def job_start_in_log(lines: Iterable[str], world_size: int) -> tuple[datetime, float] | None:
    """When the first job of the current ``world_size`` started and the floating-point
    operations of the last checkpoint saved before it (Megatron-LM's
    ``get_start_time_from_progress_log``: a line of another world size starts the search
    again); None if the lines hold no such start. Lines that do not parse are skipped."""
    start, start_flops, latest_flops = None, None, 0.0
    for line in lines:
        fields = line.strip().split("\t")
        try:
            line_world_size = _field(fields[_WORLD_SIZE_FIELD], int)
            if fields[_EVENT_FIELD] == SAVED_CHECKPOINT:
                latest_flops = _field(fields[_FLOPS_FIELD], float)
            stamp = datetime.strptime(fields[0], TIMESTAMP_FORMAT)
        except (IndexError, ValueError):
            continue
        if line_world_size != world_size:
            start, start_flops = None, None
        elif fields[_EVENT_FIELD] == STARTING_JOB and start is None:
            start, start_flops = stamp, latest_flops
    return None if start is None else (start, start_flops)


@dataclass(frozen=True)
class ProgressLog:
    """The progress log of a run that has one (``--log-progress`` with ``--save``).

    Args:
        folder: The ``--save`` folder, where progress.txt lives.
        world_size: The ranks of this job (Megatron-LM's ``# GPUs``).
        started_at: ``time.time()`` when this job started (its job throughput's clock).
        seq_length: ``--seq-length`` (Megatron-LM's tokens per consumed sample).
    """

    folder: str
    world_size: int
    started_at: float
    seq_length: int

    @classmethod
    def of(cls, run: RunConfig, world_size: int, started_at: float) -> ProgressLog | None:
        """The run's progress log, or None without ``--log-progress`` or ``--save``."""
        if not run.logging.log_progress or not run.checkpoint.save:
            return None
        return cls(run.checkpoint.save, world_size, started_at, run.model.seq_length)

    @property
    def path(self) -> str:
        return os.path.join(self.folder, PROGRESS_FILENAME)

    def job_started(self) -> None:
        """Megatron-LM's "Starting job" line (every rank calls it; rank 0 writes)."""
        agree_on_errors(self._on_rank_0, lambda: STARTING_JOB)

    def checkpoint_saved(self, iteration: int, flops_so_far: int, flops_at_start: int,
                         consumed_samples: int) -> None:
        """Megatron-LM's "Saved checkpoint" line (every rank calls it; rank 0 writes):
        ``flops_so_far`` the run's operations, ``flops_at_start`` those it had at this job's
        start (its load), ``consumed_samples`` the training samples so far."""
        def event() -> str:
            job, cumulative = throughputs(
                flops_so_far, (self.started_at, flops_at_start),
                self._first_job_start(flops_at_start), time.time(), self.world_size)
            return checkpoint_event(iteration, job, cumulative, flops_so_far,
                                    consumed_samples * self.seq_length)
        agree_on_errors(self._on_rank_0, event)

    def _first_job_start(self, flops_at_start: int) -> tuple[datetime, float]:
        """The file's start of the current world size's jobs; this job's own if the file has
        none (removed or edited since this job started)."""
        with open(self.path, encoding="utf-8") as lines:
            found = job_start_in_log(lines, self.world_size)
        if found is not None:
            return found
        return datetime.fromtimestamp(self.started_at), flops_at_start

    def _on_rank_0(self, event) -> None:
        """Appends the line of ``event()`` on global rank 0; a folder or file that cannot be
        written is one line on every rank."""
        if torch.distributed.get_rank() != 0:
            return
        try:
            os.makedirs(self.folder, exist_ok=True)  # the first save creates it too
            text = progress_line(datetime.now(), os.environ.get(JOB_ID_VARIABLE, ""),
                                 self.world_size, event())
            with open(self.path, "a", encoding="utf-8") as log:
                log.write(text)
        except OSError as err:
            raise UserInputError(
                f"--log-progress: cannot write {self.path!r}: {err.strerror or err} (make "
                f"--save writable, or drop --log-progress)") from None
