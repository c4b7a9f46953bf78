"""``TrainingConfig``: the loop: iterations, batch sizes, evaluation, loss and stop rules."""

from __future__ import annotations

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
    rampup_batch_size: tuple[int, int, int] | None = None
    """--rampup-batch-size START INCREMENT SAMPLES (batch_rampup.py); None: every step trains
    ``global_batch_size`` samples."""
    decrease_batch_size_if_needed: bool = False
    runtime_batches: bool = False
    """The caller hands each step its global batch (megatron.wrap), which may hold another
    number of samples than ``global_batch_size``: the LR schedule and the consumed samples
    follow the samples trained; no flag sets it."""

    def __post_init__(self):
        if self.rampup_batch_size is not None:  # the flag's list, hashable like the rest
            object.__setattr__(self, "rampup_batch_size", tuple(self.rampup_batch_size))
        check_ranges(self)
