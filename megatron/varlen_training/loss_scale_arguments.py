"""Megatron-LM's fp16 loss-scaling flags: ``--loss-scale``, ``--initial-loss-scale``,
``--min-loss-scale``, ``--loss-scale-window``, ``--hysteresis``.

With ``--fp16`` megatron-core scales the loss before the backward pass: by ``--loss-scale`` if
given (static), else dynamically, starting at ``--initial-loss-scale``, halving after
``--hysteresis`` overflowing steps (never below ``--min-loss-scale``) and doubling after
``--loss-scale-window`` steps without one. An overflowing step is skipped: no update, and the
LR schedule does not advance (``training.train_step``). Megatron-LM's defaults, which are
megatron-core's ``OptimizerConfig`` defaults too; the values go to that config as they are.
Without ``--fp16`` there is no scaler: Megatron-LM ignores the flags there, here a value other
than the default is one line (it would change nothing).
"""

from __future__ import annotations

LOSS_SCALE_DEFAULTS = {"loss_scale": None, "initial_loss_scale": 2.0**32,
                       "min_loss_scale": 1.0, "loss_scale_window": 1000.0, "hysteresis": 2}
"""Megatron-LM's defaults of the flags (megatron-core's OptimizerConfig has the same)."""


def add_loss_scale_args(parser) -> None:
    group = parser.add_argument_group("fp16 loss scaling")
    defaults = LOSS_SCALE_DEFAULTS
    group.add_argument("--loss-scale", type=float, default=defaults["loss_scale"],
                       help="Static loss scale (with --fp16); default: dynamic loss scaling.")
    group.add_argument("--initial-loss-scale", type=float,
                       default=defaults["initial_loss_scale"],
                       help="Initial dynamic loss scale (with --fp16).")
    group.add_argument("--min-loss-scale", type=float, default=defaults["min_loss_scale"],
                       help="Lowest dynamic loss scale (with --fp16).")
    group.add_argument("--loss-scale-window", type=float, default=defaults["loss_scale_window"],
                       help="Steps without overflow before the dynamic scale doubles.")
    group.add_argument("--hysteresis", type=int, default=defaults["hysteresis"],
                       help="Overflowing steps before the dynamic scale halves.")


def validate_loss_scale_args(args, require) -> None:
    for dest, default in LOSS_SCALE_DEFAULTS.items():
        value = getattr(args, dest)
        require(args.fp16 or value == default,
                f"--{dest.replace('_', '-')} {value} needs --fp16 (only the fp16 loss scaler "
                f"reads it; drop the flag)")
    require(args.min_loss_scale <= args.initial_loss_scale,
            f"--min-loss-scale {args.min_loss_scale} exceeds --initial-loss-scale "
            f"{args.initial_loss_scale} (the dynamic scale starts there and never goes below "
            f"the minimum)")
