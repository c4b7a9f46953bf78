"""Which samples each training iteration reads: one global batch of ``--global-batch-size``,
or, with Megatron-LM's ``--rampup-batch-size START INCREMENT SAMPLES``, a batch that grows.

Megatron-LM's ramp-up (megatron-core's ``RampupBatchsizeNumMicroBatchesCalculator`` decides the
size, Megatron-LM's training loop walks it), as :class:`GlobalBatchSchedule` computes it:

- The batch size of a step depends on the samples consumed before it, ``c``: while
  ``c <= SAMPLES`` it is ``START + INCREMENT * int(c / (SAMPLES / n))`` with
  ``n = (--global-batch-size - START) / INCREMENT`` increments; afterwards
  ``--global-batch-size``.
- With ``--decrease-batch-size-if-needed`` a size that ``--micro-batch-size`` x DP does not
  divide is rounded down to a multiple of it (the "running" size); without it such a size is an
  error (megatron-core asserts; here it is refused before training).
- Step ``i`` reads the running size's samples that follow the ones consumed before it, in order
  (Megatron-LM's sampler continues from the consumed samples); the consumed samples, the LR
  schedule and the iteration line's ``global batch size`` advance by that running size.
- ``--train-samples`` gives the iterations as Megatron-LM's ``update_train_iters`` counts them:
  ramp-up steps while ``c <= SAMPLES`` and ``c <= --train-samples`` (with the sizes before any
  rounding down), then whole ``--global-batch-size`` batches of the samples left.
- With ``--save``, a checkpoint is saved before the first step of a larger batch (Megatron-LM
  does; pretrain.py).
- Without ramp-up a resumed run continues at the samples its checkpoint consumed, as
  Megatron-LM's sampler does, also with another ``--global-batch-size``: :class:`BatchAnchor`
  is that (iteration, consumed samples), and the batches from it on are of this run's size
  (resumed_batch_anchor.py finds it).

Pure Python (the flag layer uses it); tests check it against megatron-core's calculator.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


# The ramp-up is walked step by step (Megatron-LM's loop counts it so): ten million steps take
# seconds at start-up; more is refused rather than a start-up that seems to hang.
MAX_RAMPUP_STEPS = 10**7


@dataclass(frozen=True)
class Rampup:
    """``--rampup-batch-size START INCREMENT SAMPLES`` (validated: START < the global batch
    size, which it reaches in whole increments)."""

    start: int
    increment: int
    samples: int

    def num_increments(self, global_batch_size: int) -> int:
        return (global_batch_size - self.start) // self.increment


@dataclass(frozen=True)
class BatchAnchor:
    """Where the batches of the current ``--global-batch-size`` begin: global batch
    ``iteration`` (0-based, the first after the resumed checkpoint) starts at sample
    ``first_sample``. Iterations before it trained batches of another size (the checkpoint it
    resumed holds what they consumed)."""

    iteration: int
    first_sample: int


class BatchFlags(Protocol):
    """The batch flags a schedule is built from, as their dests name them: the validated
    namespace (``num_microbatches`` derived there) and ``TrainingConfig`` both have them."""

    global_batch_size: int
    num_microbatches: int  # per DP rank: --global-batch-size // (--micro-batch-size x DP)
    rampup_batch_size: Sequence[int] | None
    decrease_batch_size_if_needed: bool
    global_batch_anchor: Sequence[int] | None  # (iteration, first sample); None: (0, 0)


@dataclass(frozen=True)
class GlobalBatchSchedule:
    """The global batch of every iteration. ``micro_batch_times_dp``: ``--micro-batch-size``
    x the data-parallel size (a running batch size is a multiple of it); ``rampup`` None: every
    batch is ``global_batch_size`` samples; ``anchor``: where those batches begin (a resume
    with another batch size; never with a ramp-up)."""

    global_batch_size: int
    micro_batch_times_dp: int
    rampup: Rampup | None = None
    decrease_if_needed: bool = False
    anchor: BatchAnchor = BatchAnchor(0, 0)

    def __post_init__(self):
        if self.rampup is not None and self.anchor != BatchAnchor(0, 0):
            raise ValueError("a ramp-up starts at sample 0: it has no anchor")

    @classmethod
    def of(cls, batch: BatchFlags) -> GlobalBatchSchedule:
        """The one way from flags to a schedule: the validated namespace's batch fields (the
        flag layer, before any config exists) or a ``TrainingConfig``'s, named alike."""
        ramp, anchor = batch.rampup_batch_size, batch.global_batch_anchor
        return cls(batch.global_batch_size,
                   batch.global_batch_size // batch.num_microbatches,  # = mbs x DP, validated
                   Rampup(*ramp) if ramp is not None else None,
                   batch.decrease_batch_size_if_needed,
                   BatchAnchor(*anchor) if anchor is not None else BatchAnchor(0, 0))

    # --- sizes by consumed samples (megatron-core's calculator) -----------------------------

    def nominal_size(self, consumed: int) -> int:
        """The ramp's batch size after ``consumed`` samples, before rounding down."""
        ramp = self.rampup
        if ramp is None or consumed > ramp.samples:
            return self.global_batch_size
        per_increment = ramp.samples / ramp.num_increments(self.global_batch_size)
        return ramp.start + int(consumed / per_increment) * ramp.increment

    def running_size(self, consumed: int) -> int:
        """The samples the step after ``consumed`` samples trains (rounded down to a multiple
        of ``micro_batch_times_dp`` with ``decrease_if_needed``)."""
        size = self.nominal_size(consumed)
        if self.decrease_if_needed:
            return size // self.micro_batch_times_dp * self.micro_batch_times_dp
        return size

    # --- by iteration -----------------------------------------------------------------------

    @functools.cached_property
    def _ramp_starts(self) -> list[int]:
        """The first sample of every ramp-up iteration, then the sample where the constant
        phase begins (a single 0 without ramp-up)."""
        starts, consumed = [0], 0
        while self.rampup is not None and consumed <= self.rampup.samples:
            size = self.running_size(consumed)
            assert size > 0, "validation refuses a ramp-up that rounds a batch down to 0"
            consumed += size
            starts.append(consumed)
        return starts

    def first_sample(self, iteration: int) -> int:
        """Samples consumed before ``iteration`` (0-based): where its global batch starts
        (before the anchor: counted back in batches of the current size, never below 0; the
        loop reads none of those)."""
        if self.rampup is None:
            anchor = self.anchor
            return max(anchor.first_sample
                       + (iteration - anchor.iteration) * self.global_batch_size, 0)
        starts = self._ramp_starts
        ramp_iters = len(starts) - 1
        if iteration <= ramp_iters:
            return starts[iteration]
        return starts[-1] + (iteration - ramp_iters) * self.global_batch_size

    def size(self, iteration: int) -> int:
        """Samples of global batch ``iteration``."""
        return self.first_sample(iteration + 1) - self.first_sample(iteration)

    def indices(self, iteration: int) -> range:
        """Dataset indices of global batch ``iteration``, in order."""
        return range(self.first_sample(iteration), self.first_sample(iteration + 1))

    def iterations_within(self, num_samples: int) -> int:
        """The iterations whose global batches lie within the first ``num_samples`` samples."""
        if self.rampup is None:
            anchor = self.anchor
            return anchor.iteration + (num_samples - anchor.first_sample) // self.global_batch_size
        starts = self._ramp_starts
        if num_samples <= starts[-1]:
            return bisect.bisect_right(starts, num_samples) - 1
        return len(starts) - 1 + (num_samples - starts[-1]) // self.global_batch_size

    def train_iters(self, train_samples: int) -> int:
        """Iterations of a ``--train-samples`` run (Megatron-LM's ``update_train_iters``: it
        walks the ramp-up with the sizes before rounding down; the partial last batch is
        dropped)."""
        if self.rampup is None:  # (resumed with another batch size: from the anchor on)
            return max(self.iterations_within(train_samples), self.anchor.iteration)
        iterations = consumed = 0
        while consumed <= self.rampup.samples and consumed <= train_samples:
            consumed += self.nominal_size(consumed)
            iterations += 1
        return iterations + max(train_samples - consumed, 0) // self.global_batch_size

    def ramp_sizes(self, train_iters: int) -> list[int]:
        """The distinct nominal sizes the first ``train_iters`` iterations train (ramp-up
        only; for the divisibility check)."""
        ramp_iters = min(len(self._ramp_starts) - 1, train_iters)
        return sorted({self.nominal_size(self._ramp_starts[i]) for i in range(ramp_iters)})


class RampupMessages:
    """Megatron-LM's lines about the ramp-up (megatron-core's calculator logs them on rank 0):
    the plan and the initial size at start, then a line whenever the size changes, and with
    ``--decrease-batch-size-if-needed`` the size a changed one was rounded down to."""

    def __init__(self, schedule: GlobalBatchSchedule, micro_batch_size: int):
        self._schedule, self._micro_batch_size = schedule, micro_batch_size
        self._size: int | None = None

    def at(self, consumed: int) -> list[str]:
        """The lines due before the step after ``consumed`` samples (none without ramp-up)."""
        schedule, ramp = self._schedule, self._schedule.rampup
        if ramp is None:
            return []
        lines = []
        if self._size is None:
            # "batchsize": megatron-core's line as it prints it (its f-strings join there)
            lines.append(f"will use batch size rampup starting from global batch size "
                         f"{ramp.start} to global batch size {schedule.global_batch_size} with "
                         f"batchsize increments {ramp.increment} over {ramp.samples} samples.")
            self._size = schedule.nominal_size(0)
            lines += [f"setting initial batch size to {self._size}", *self._decreased(0)]
        size = schedule.nominal_size(consumed)
        if size != self._size:
            lines += [f"ramping up batch size from {self._size} to {size}",
                      *self._decreased(consumed)]
            self._size = size
        return lines

    def _decreased(self, consumed: int) -> list[str]:
        size, running = (self._schedule.nominal_size(consumed),
                         self._schedule.running_size(consumed))
        if size == running:
            return []
        dp = self._schedule.micro_batch_times_dp // self._micro_batch_size
        return [f"decreasing batch size from {size} to {running} to keep divisiblity by "
                f"micro_batch_size={self._micro_batch_size} * data_parallel_size={dp}"]
