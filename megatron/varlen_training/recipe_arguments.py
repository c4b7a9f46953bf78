"""The fine-tuning and communication-overlap flags a training recipe sets (Megatron-LM's names
and semantics) and their checks.

Fine-tuning (what a ``--load`` restores; :mod:`megatron.varlen_training.load_options`):

- ``--finetune``: model weights only; the iteration starts at 0; optimizer state, LR/WD schedule
  and random states are not loaded, and the resume checks meant for continuing a run (data
  order, data files, optimizer layout, schedule) are skipped: only the model's shape must match.
- ``--no-load-optim``: no optimizer state and no LR/WD schedule (this run's flags start it
  afresh); the iteration and the random states are restored.
- ``--no-load-rng``: no random states (dropout masks differ from an uninterrupted run).
- ``--pretrained-checkpoint DIR``: when ``--load`` holds no checkpoint (or is not given), start
  from ``DIR`` as ``--finetune`` does; once ``--load`` holds one (a restarted job saving there),
  resume from ``--load``.

Communication overlap (megatron-core's DDP and distributed optimizer, wired in
``training.setup_model_and_optimizer``):

- ``--overlap-grad-reduce``: each gradient bucket's reduction starts while backward still runs.
- ``--overlap-param-gather``: the distributed optimizer's parameter all-gather runs in the next
  forward (needs ``--use-distributed-optimizer`` and ``--overlap-grad-reduce``).
"""

from __future__ import annotations

import os


def add_recipe_args(parser) -> None:
    group = parser.add_argument_group("fine-tuning")
    group.add_argument("--finetune", action="store_true",
                       help="Load model weights only: iteration 0, no optimizer, LR schedule or "
                            "random states; only the model shape is checked against the "
                            "checkpoint (other data and schedules are fine).")
    group.add_argument("--no-load-optim", action="store_true",
                       help="Do not load the optimizer state (nor the LR/WD schedule) when "
                            "loading a checkpoint.")
    group.add_argument("--no-load-rng", action="store_true",
                       help="Do not load the random states when loading a checkpoint.")
    group.add_argument("--pretrained-checkpoint", default=None,
                       help="Checkpoint directory to fine-tune from (as with --finetune) when "
                            "--load holds no checkpoint yet.")
    group = parser.add_argument_group("communication overlap")
    group.add_argument("--overlap-grad-reduce", action="store_true",
                       help="Overlap the data-parallel gradient reduction with backward.")
    group.add_argument("--overlap-param-gather", action="store_true",
                       help="Overlap the distributed optimizer's parameter all-gather with the "
                            "next forward (with --use-distributed-optimizer and "
                            "--overlap-grad-reduce).")


def validate_recipe_args(args, require) -> None:
    pretrained = args.pretrained_checkpoint
    require(pretrained is None or os.path.isdir(pretrained),
            f"--pretrained-checkpoint directory {pretrained!r} does not exist")
    for flag, given in (("--finetune", args.finetune), ("--no-load-optim", args.no_load_optim),
                        ("--no-load-rng", args.no_load_rng)):
        require(not given or args.load is not None or pretrained is not None,
                f"{flag} says what to load, but there is nothing to load (pass --load or "
                f"--pretrained-checkpoint)")
    require(not args.overlap_param_gather or args.use_distributed_optimizer,
            "--overlap-param-gather needs --use-distributed-optimizer (it overlaps the "
            "distributed optimizer's parameter all-gather)")
    require(not args.overlap_param_gather or args.overlap_grad_reduce,
            "--overlap-param-gather needs --overlap-grad-reduce (as in Megatron-LM)")


def load_dir_problem(load: str | None, pretrained: str | None, save: str | None = None,
                     exit_on_missing: bool = False) -> str | None:
    """Why ``--load`` cannot be used, or None. With ``--pretrained-checkpoint`` it may be
    missing or empty: the run then starts from the pretrained checkpoint; so may it when it is
    also ``--save`` (a restartable job's first launch, unless ``--exit-on-missing-checkpoint``:
    load_options.fresh_start_note)."""
    if load is None or os.path.isdir(load) or pretrained is not None:
        return None
    if save is not None and not exit_on_missing \
            and os.path.realpath(save) == os.path.realpath(load):
        return None
    return f"--load directory {load!r} does not exist"
