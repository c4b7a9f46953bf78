"""Flags and start-up checks that keep a run from going silently wrong.

- ``--check-for-nan-in-loss-and-grad`` (Megatron-LM's name, on by default): stop at the first
  NaN/Inf loss or gradient norm (see :mod:`megatron.varlen_training.nonfinite`).
- ``--override-opt_param-scheduler`` / ``--use-checkpoint-opt_param-scheduler`` (Megatron-LM's
  names): which side wins when a resumed run's LR/WD schedule differs from the checkpoint's
  (see :mod:`megatron.varlen_training.resume.consistency`).
- ``--distributed-timeout-minutes`` (Megatron-LM's name): the collective timeout.
- ``--save`` must be writable before any work. Every numeric flag's range (sizes, counts and
  intervals >= 1, the timeout, ...) is checked in :mod:`megatron.varlen_training.flag_ranges`.
"""

from __future__ import annotations

import os
import tempfile


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
    # Megatron-LM core_v0.16.1 accepts the all-dash spellings too (from its SchedulerConfig).
    group.add_argument("--override-opt_param-scheduler", "--override-opt-param-scheduler",
                       action="store_true",
                       help="On --load, use this run's LR/WD schedule flags instead of the "
                            "checkpoint's (the schedule's progress is kept).")
    group.add_argument("--use-checkpoint-opt_param-scheduler",
                       "--use-checkpoint-opt-param-scheduler", action="store_true",
                       help="On --load, keep the checkpoint's LR/WD schedule even where this "
                            "run's flags differ.")
    # Resume identity of the data (see megatron.varlen_training.resume.consistency).
    group.add_argument("--override-data-fingerprint", action="store_true",
                       help="On --load, train on --data-path files whose content (size and "
                            "SHA-256) differs from the checkpoint's, from the saved position.")
    add_exit_condition_args(parser)


# --- exit conditions (megatron/varlen_training/exit_conditions.py) ------------------------------
# Megatron-LM's names; their ranges are in flag_ranges.py with every other numeric flag.


def add_exit_condition_args(parser) -> None:
    group = parser.add_argument_group("exit conditions")
    group.add_argument("--exit-signal-handler", action="store_true",
                       help="On SIGTERM (or --exit-signal) or SIGINT (on any rank), finish "
                            "the current iteration, save a checkpoint (with --save) and exit "
                            "with code 0; a second signal ends the process at once.")
    group.add_argument("--exit-interval", type=int, default=None,
                       help="Save (with --save) and exit with code 0 after the first "
                            "iteration that is a multiple of this number.")
    group.add_argument("--exit-duration-in-mins", type=float, default=None,
                       help="Save (with --save) and exit with code 0 after the first "
                            "iteration that ends this many minutes after the run started.")


# --- end of exit conditions ---------------------------------------------------------------


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
    require(not (args.override_opt_param_scheduler and args.use_checkpoint_opt_param_scheduler),
            "--override-opt_param-scheduler and --use-checkpoint-opt_param-scheduler are "
            "mutually exclusive")
    if args.save:
        problem = _save_dir_problem(args.save)
        require(problem is None,
                f"--save directory {args.save!r} is not writable ({problem}); checked at "
                f"start-up so no training is lost at the first save")
