"""``OptimizerConfig``: Adam, gradient clipping and the learning-rate/weight-decay schedule."""

from __future__ import annotations

from dataclasses import dataclass

from megatron.varlen_training import flag_ranges
from megatron.varlen_training.config.validation import check_problems, check_ranges


@dataclass(frozen=True)
class OptimizerConfig:
    """Fields named as their flags' dests; ``lr_decay_iters`` as resolved (default
    ``--train-iters``; None in a sample-based run). ``lr_warmup_steps``, ``lr_decay_steps``
    and ``wd_incr_steps`` are the schedule's lengths in samples, as megatron-core's scheduler
    counts, resolved from either kind of schedule (schedule_arguments.py; Megatron-LM's
    names). The last two say which side wins when a resumed run's schedule differs from the
    checkpoint's."""

    lr: float
    min_lr: float
    lr_decay_style: str
    lr_decay_iters: int | None
    lr_warmup_iters: int
    weight_decay: float
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    clip_grad: float
    use_distributed_optimizer: bool
    override_opt_param_scheduler: bool
    use_checkpoint_opt_param_scheduler: bool
    lr_warmup_steps: float
    lr_decay_steps: int
    wd_incr_steps: int
    # The weight decay at the start and the end of the run, resolved (schedule_arguments.py):
    # --weight-decay for the constant style, else --start-weight-decay / --end-weight-decay.
    start_wd: float
    end_wd: float
    # Megatron-LM's warm-up start, WSD and weight-decay ramp flags as given, and the resolved
    # WSD anneal (samples; None without WSD).
    lr_warmup_init: float = 0.0
    lr_wsd_decay_style: str = "exponential"
    lr_wsd_decay_iters: int | None = None
    lr_wsd_decay_samples: int | None = None
    start_weight_decay: float | None = None
    end_weight_decay: float | None = None
    weight_decay_incr_style: str = "constant"
    wsd_decay_steps: int | None = None
    # --fp16's loss scaler (loss_scale_arguments.py; Megatron-LM's and megatron-core's defaults).
    loss_scale: float | None = None
    initial_loss_scale: float = 2.0**32
    min_loss_scale: float = 1.0
    loss_scale_window: float = 1000.0
    hysteresis: int = 2
    # --decoupled-lr / --decoupled-min-lr: the input embedding's and output layer's own peak and
    # final LR (megatron-core's param group override; None: --lr / --min-lr).
    decoupled_lr: float | None = None
    decoupled_min_lr: float | None = None
    # --optimizer adam|sgd, SGD's momentum and weight decay on the q/k layernorms
    # (optimizer_arguments.py; megatron-core's OptimizerConfig fields of the same names).
    optimizer: str = "adam"
    sgd_momentum: float = 0.9
    apply_wd_to_qk_layernorm: bool = False

    def __post_init__(self):
        check_ranges(self)
        check_problems(flag_ranges.learning_rate_problem(self.lr, self.min_lr),
                       flag_ranges.decoupled_learning_rate_problem(
                           self.decoupled_lr, self.decoupled_min_lr, self.min_lr))
