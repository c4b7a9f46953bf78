"""Flags and start-up checks that keep a run from going silently wrong.

- ``--check-for-nan-in-loss-and-grad`` (Megatron-LM's name, on by default): stop at the first
  NaN/Inf loss or gradient norm (see :mod:`megatron.training.nonfinite`).
- ``--override-opt_param-scheduler`` / ``--use-checkpoint-opt_param-scheduler`` (Megatron-LM's
  names): which side wins when a resumed run's LR/WD schedule differs from the checkpoint's
  (see :mod:`megatron.training.resume_consistency`).
- ``--distributed-timeout-minutes`` (Megatron-LM's name): the collective timeout.
- Sizes, counts and intervals must be positive, and ``--save`` writable, before any work.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile

# Flags whose value is a size, count or interval: 0 or less would divide by zero (or silently
# do nothing) later. Optional ones (default None) are checked only when given.
POSITIVE_INT_FLAGS = (
    "num_layers", "hidden_size", "num_attention_heads", "seq_length", "micro_batch_size",
    "global_batch_size", "train_iters", "tensor_model_parallel_size",
    "pipeline_model_parallel_size", "context_parallel_size", "log_interval", "eval_interval",
    "save_interval", "num_layers_per_virtual_pipeline_stage", "ffn_hidden_size",
    "num_query_groups", "max_position_embeddings", "make_vocab_size_divisible_by",
    "lr_decay_iters",
)
NON_NEGATIVE_INT_FLAGS = ("eval_iters", "lr_warmup_iters")


def add_reliability_args(parser) -> None:
    group = parser.add_argument_group("reliability")
    group.add_argument("--check-for-nan-in-loss-and-grad", dest="check_for_nan_in_loss_and_grad",
                       action="store_true", default=True,
                       help="Stop with a one-line error at the first iteration whose loss or "
                            "gradient norm is NaN/Inf, before it is saved (default on).")
    group.add_argument("--no-check-for-nan-in-loss-and-grad",
                       dest="check_for_nan_in_loss_and_grad", action="store_false",
                       help="Keep training through NaN/Inf losses (not recommended).")
    group.add_argument("--distributed-timeout-minutes", type=float, default=10.0,
                       help="How long a collective waits for an unresponsive peer before the "
                            "run fails (a peer that died is reported at once).")
    group.add_argument("--override-opt_param-scheduler", action="store_true",
                       help="On --load, use this run's LR/WD schedule flags instead of the "
                            "checkpoint's (the schedule's progress is kept).")
    group.add_argument("--use-checkpoint-opt_param-scheduler", action="store_true",
                       help="On --load, keep the checkpoint's LR/WD schedule even where this "
                            "run's flags differ.")
    add_exit_condition_args(parser)


# --- exit conditions (megatron/training/exit_conditions.py) ---------------------------------
# Megatron-LM's names. Checked by their argparse types, so a bad value is the parser's one line.


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 (got {value})")
    return value


def _positive_minutes(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected minutes > 0, got {text!r}") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be > 0 minutes (got {text})")
    return value


def add_exit_condition_args(parser) -> None:
    group = parser.add_argument_group("exit conditions")
    group.add_argument("--exit-signal-handler", action="store_true",
                       help="On SIGTERM or SIGINT (on any rank), finish the current iteration, "
                            "save a checkpoint (with --save) and exit with code 0; a second "
                            "signal ends the process at once.")
    group.add_argument("--exit-interval", type=_positive_int, default=None,
                       help="Save (with --save) and exit with code 0 after the first "
                            "iteration that is a multiple of this number.")
    group.add_argument("--exit-duration-in-mins", type=_positive_minutes, default=None,
                       help="Save (with --save) and exit with code 0 after the first "
                            "iteration that ends this many minutes after the run started.")


# --- end of exit conditions ---------------------------------------------------------------


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def validate_positive_sizes(args, require) -> None:
    """Runs first: later checks divide by these values."""
    for dest in POSITIVE_INT_FLAGS:
        value = getattr(args, dest, None)
        require(value is None or value >= 1, f"{_flag(dest)} must be >= 1 (got {value})")
    for dest in NON_NEGATIVE_INT_FLAGS:
        value = getattr(args, dest, None)
        require(value is None or value >= 0, f"{_flag(dest)} must be >= 0 (got {value})")


def _save_dir_problem(path: str) -> str | None:
    """Why ``path`` cannot take checkpoints, or None (creates it, as the first save would)."""
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write_probe_"):
            pass
    except OSError as err:
        return err.strerror or type(err).__name__
    return None


def validate_reliability_args(args, require) -> None:
    require(args.distributed_timeout_minutes > 0,
            f"--distributed-timeout-minutes must be > 0 (got {args.distributed_timeout_minutes})")
    require(not (args.override_opt_param_scheduler and args.use_checkpoint_opt_param_scheduler),
            "--override-opt_param-scheduler and --use-checkpoint-opt_param-scheduler are "
            "mutually exclusive")
    if args.save:
        problem = _save_dir_problem(args.save)
        require(problem is None,
                f"--save directory {args.save!r} is not writable ({problem}); checked at "
                f"start-up so no training is lost at the first save")
