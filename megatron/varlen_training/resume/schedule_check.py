"""A resumed run's LR/WD schedule against the checkpoint's scheduler state, Megatron-LM's way:
a difference is refused in one line unless ``--override-opt_param-scheduler`` (this run's flags
win) or ``--use-checkpoint-opt_param-scheduler`` (the checkpoint's schedule wins) says which
side wins.
"""

from __future__ import annotations

from megatron.varlen_training.config import RunConfig
from megatron.varlen_training.errors import CheckpointError

# megatron-core scheduler state key -> (this run's flag, scheduler attribute, samples per unit)
SCHEDULER_KEYS = {
    "max_lr": ("--lr", "max_lr", False),
    "min_lr": ("--min-lr", "min_lr", False),
    "lr_warmup_steps": ("--lr-warmup-iters", "lr_warmup_steps", True),
    "lr_decay_steps": ("--lr-decay-iters (default --train-iters)", "lr_decay_steps", True),
    "lr_decay_style": ("--lr-decay-style", "lr_decay_style", False),
    "start_wd": ("--weight-decay (or --start-weight-decay)", "start_wd", False),
    "end_wd": ("--weight-decay (or --end-weight-decay)", "end_wd", False),
    "wd_incr_style": ("--weight-decay-incr-style", "wd_incr_style", False),
    # Only a ramp has a length: constant weight decay ignores it (RAMP_ONLY_KEYS).
    "wd_incr_steps": ("the weight-decay ramp over --train-iters", "wd_incr_steps", True),
}
RAMP_ONLY_KEYS = ("wd_incr_steps",)
# The same lengths in a sample-based run (--train-samples), named and shown in samples.
SAMPLE_BASED_FLAGS = {
    "lr_warmup_steps": "--lr-warmup-samples",
    "lr_decay_steps": "--lr-decay-samples (default --train-samples)",
    "wd_incr_steps": "the weight-decay ramp over --train-samples",
}


def check_scheduler(state: dict, scheduler, run: RunConfig,
                    saved_batch_size: int | None = None) -> None:
    """Refuses a schedule difference unless a flag says which side wins (module docstring;
    --decoupled-lr's bounds: optimizer_layout_check.decoupled_lr_mismatch).
    ``saved_batch_size``: the checkpoint's --global-batch-size (None: this run's), which its
    iteration-based lengths were counted in."""
    optimizer = run.optimizer
    if optimizer.override_opt_param_scheduler or optimizer.use_checkpoint_opt_param_scheduler:
        return
    samples_per_iter = run.training.global_batch_size
    saved_per_iter = saved_batch_size or samples_per_iter
    sample_based = optimizer.lr_decay_iters is None  # --train-samples (schedule_arguments.py)
    for key, (flag, attribute, in_samples) in SCHEDULER_KEYS.items():
        saved, mine = state.get(key), getattr(scheduler, attribute)
        if saved is None or saved == mine:
            continue
        if key in RAMP_ONLY_KEYS and scheduler.wd_incr_style == "constant":
            continue  # e.g. a longer --train-iters: a constant weight decay stays the same
        if in_samples and sample_based:
            flag, saved, mine = SAMPLE_BASED_FLAGS[key], f"{saved:g}", f"{mine:g}"
        elif in_samples:  # megatron-core counts in samples; users set iterations
            saved, mine = f"{saved / saved_per_iter:g}", f"{mine / samples_per_iter:g}"
            if saved_per_iter != samples_per_iter:  # a resume with another batch size
                saved += f" x --global-batch-size {saved_per_iter}"
                mine += f" x {samples_per_iter}"
        raise CheckpointError(
            f"--load: the checkpoint's schedule has {flag} {saved}, this run has {mine}; pass "
            f"--override-opt_param-scheduler to use this run's value or "
            f"--use-checkpoint-opt_param-scheduler to keep the checkpoint's")
