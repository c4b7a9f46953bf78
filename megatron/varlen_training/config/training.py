"""``TrainingConfig``: the loop: iterations, batch sizes, evaluation, loss and stop rules."""

from __future__ import annotations

import signal
from dataclasses import dataclass

from megatron.varlen_training.config.validation import check_ranges


@dataclass(frozen=True)
class TrainingConfig:
    """Fields named as their flags' dests; ``global_batch_size`` and ``num_microbatches`` as
    validation resolved them (packing implies ``calculate_per_token_loss``)."""

    train_iters: int
    global_batch_size: int
    micro_batch_size: int
    num_microbatches: int
    seed: int
    calculate_per_token_loss: bool
    eval_interval: int
    eval_iters: int
    check_for_nan_in_loss_and_grad: bool
    exit_signal_handler: bool
    exit_interval: int | None
    exit_duration_in_mins: float | None
    exit_signal: signal.Signals = signal.SIGTERM
    """``--exit-signal``: the signal ``--exit-signal-handler`` catches (SIGINT too)."""
    eval_global_batch_size: int | None = None
    """``--eval-global-batch-size``: samples per evaluation batch (None: ``global_batch_size``,
    see :attr:`eval_batch_size`)."""
    start_eval_at_iter: int | None = None
    """``--start-eval-at-iter``: no in-loop evaluation before this iteration."""
    skip_train: bool = False
    """``--skip-train``: evaluate (validation, test) and exit; no step, nothing saved."""
    rampup_batch_size: tuple[int, int, int] | None = None
    """--rampup-batch-size START INCREMENT SAMPLES (batch_rampup.py); None: every step trains
    ``global_batch_size`` samples."""
    decrease_batch_size_if_needed: bool = False
    global_batch_anchor: tuple[int, int] | None = None
    """(iteration, first sample) where the ``global_batch_size`` batches begin: a resumed
    run's checkpoint iteration and consumed samples (resumed_batch_anchor.py; its batch size
    may differ); None: iteration 0, sample 0. No flag sets it."""
    runtime_batches: bool = False
    """The caller hands each step its global batch (megatron.wrap), which may hold another
    number of samples than ``global_batch_size``: the LR schedule and the consumed samples
    follow the samples trained; no flag sets it."""

    def __post_init__(self):
        if self.rampup_batch_size is not None:  # the flag's list, hashable like the rest
            object.__setattr__(self, "rampup_batch_size", tuple(self.rampup_batch_size))
        if self.global_batch_anchor is not None:
            object.__setattr__(self, "global_batch_anchor", tuple(self.global_batch_anchor))
        check_ranges(self)

    @property
    def eval_batch_size(self) -> int:
        """The samples of one evaluation batch (Megatron-LM's default: the training ones)."""
        return self.eval_global_batch_size or self.global_batch_size
