"""Megatron-LM's checkpoint-content, save-strategy and load-strictness flags (its
``_add_checkpointing_args`` beyond checkpoint_arguments.py): honoured, accepted as Megatron-LM
accepts them, or refused in one line.

Honoured:

- ``--no-save-optim`` / ``--no-save-rng``: the checkpoint holds no optimizer state and LR/WD
  schedule / no random states (checkpoint/parts.py). As in Megatron-LM, a resume from a
  checkpoint without optimizer state stops in one line unless ``--no-load-optim`` (or
  ``--finetune``) says not to load it; one without random states resumes without them.
- ``--ckpt-fully-parallel-save`` (default; ``--no-ckpt-fully-parallel-save`` /
  ``--disable-ckpt-fully-parallel-save`` turn it off) and ``--ckpt-fully-parallel-load``:
  megatron-core's fully parallel strategies spread the writes / reads of replicated shards
  over the data-parallel ranks; the checkpoint's content is the same either way.
- ``--dist-ckpt-strictness``: what a load does with keys the checkpoint and the model do not
  share (megatron-core's StrictHandling; the ``return_*`` modes, which only hand the keys to a
  caller, are refused).
- ``--persistent-save-interval``: Megatron-LM's other name of ``--save-interval``.
- ``--dist-ckpt-optim-fully-reshardable``: the distributed optimizer's state is saved in
  megatron-core's ``fully_reshardable`` format (gathered to the parameters' shapes, keyed like
  the weights), so a resume may change TP, PP, EP, expert TP and the virtual pipeline as well
  as data parallelism; without it, ``dp_reshardable`` (data parallelism only).
  ``--distrib-optim-fully-reshardable-mem-efficient`` gathers that state over gloo to
  data-parallel rank 0 alone (less memory, no parallel save; the same content); as in
  Megatron-LM it has no effect without ``--dist-ckpt-optim-fully-reshardable``
  (checkpoint/sharding.py).

Accepted, as Megatron-LM core_v0.16.1 accepts them: ``--use-dist-ckpt`` and
``--dist-ckpt-format`` (deprecated, "no effect": ``--ckpt-format`` selects the format; the same
line is printed), ``--ckpt-assume-constant-structure`` (a save-planning cache; the saved
content is the same, here each save is planned afresh), ``--no-strict-fsdp-dtensor-load``
(read for fsdp_dtensor checkpoints only, refused here).
"""

from __future__ import annotations

import argparse

from megatron.varlen_training.log import warning_rank_0
from megatron.varlen_training.refused_flags import SWITCH, FlagRow, add_flag_rows, refuse_given

# megatron-core's StrictHandling values (dist_checkpointing/validation.py), as Megatron-LM
# offers them; the return_* ones change what the load returns, for callers that want the keys.
STRICTNESS_CHOICES = ("assume_ok_unexpected", "log_unexpected", "log_all", "raise_unexpected",
                      "raise_all", "return_unexpected", "return_all", "ignore_all")
DEFAULT_STRICTNESS = "assume_ok_unexpected"
_RETURNING_STRICTNESS = ("return_unexpected", "return_all")
# Megatron-LM's own line for the deprecated flags (core_v0.16.1 validate_args).
DEPRECATED_FLAG_NOTE = ("{flag} is deprecated and has no effect. Use --ckpt-format to select "
                        "the checkpoint format.")
FULLY_PARALLEL_SAVE_NOTE = ("--ckpt-fully-parallel-save flag is deprecated and has no effect. "
                            "Use --no-ckpt-fully-parallel-save to disable parallel save.")
_LOCAL_WHY = "every save is a persistent torch_dist checkpoint here; use --save-interval"
_CONVERT_WHY = "this fork does not convert checkpoints between formats"
REFUSED_FLAGS = (
    FlagRow(("--ckpt-convert-format",), {"choices": ("torch", "torch_dist", "zarr")}, None,
            _CONVERT_WHY),
    FlagRow(("--ckpt-convert-save",), {}, None, _CONVERT_WHY),
    FlagRow(("--ckpt-convert-update-legacy-dist-opt-format",), SWITCH, False, _CONVERT_WHY),
    FlagRow(("--non-persistent-global-ckpt-dir",), {}, None, _LOCAL_WHY),
    FlagRow(("--non-persistent-local-ckpt-dir",), {}, None, _LOCAL_WHY),
    FlagRow(("--non-persistent-local-ckpt-algo",), {"choices": ("fully_parallel", "atomic")},
            "fully_parallel", _LOCAL_WHY),
    FlagRow(("--replication",), SWITCH, False, _LOCAL_WHY),
    FlagRow(("--replication-jump",), {"type": int}, None, _LOCAL_WHY),
    FlagRow(("--replication-factor",), {"type": int}, 2, _LOCAL_WHY),
    FlagRow(("--use-persistent-ckpt-worker",), SWITCH, False,
            "saves are synchronous here (no async checkpoint worker)"),
    FlagRow(("--save-retain-interval",), {"type": int}, None,
            "every saved checkpoint is kept here (none is deleted)"),
    FlagRow(("--save-wgrads-interval",), {"type": int}, None, "gradients are not saved here"),
    FlagRow(("--save-dgrads-interval",), {"type": int}, None, "gradients are not saved here"),
    FlagRow(("--load-main-params-from-ckpt",), SWITCH, False,
            "the optimizer's fp32 main parameters follow the loaded weights here (megatron-core's "
            "reload_model_params)"),
    FlagRow(("--dist-ckpt-save-pre-mcore-014",), SWITCH, False,
            "checkpoints are saved in megatron-core 0.16.1's layout"),
    FlagRow(("--use-mp-args-from-checkpoint-args",), SWITCH, False,
            "--use-checkpoint-args takes the model flags; the parallel sizes come from the "
            "command line here"),
    FlagRow(("--dist-ckpt-workers",), {"type": int}, 1,
            "megatron-core 0.16.1 saves with one writer process per rank (Megatron-LM main only)"),
    FlagRow(("--ckpt-drop-redundant-extra-state",), SWITCH, False,
            "Megatron-LM main only: Transformer Engine's extra state is saved as megatron-core "
            "0.16.1 does"),
    FlagRow(("--override-ckpt-iteration",), {"type": int}, None,
            "Megatron-LM main only; a resume continues the saved iteration here (--ckpt-step "
            "picks which)"),
)


def add_checkpoint_save_args(parser: argparse.ArgumentParser) -> None:
    """Registers the checkpoint-content, save-strategy and strictness flags."""
    group = parser.add_argument_group("checkpoint content and strategies")
    group.add_argument("--no-save-optim", action="store_true",
                       help="Save no optimizer state or LR/WD schedule (a resume then needs "
                            "--no-load-optim or --finetune, as in Megatron-LM).")
    group.add_argument("--no-save-rng", action="store_true",
                       help="Save no random states (a resume then starts without them).")
    group.add_argument("--no-ckpt-fully-parallel-save", "--disable-ckpt-fully-parallel-save",
                       action="store_false", dest="ckpt_fully_parallel_save",
                       help="Every data-parallel replica writes its own shards' first copy "
                            "only as megatron-core's default strategy decides, instead of the "
                            "writes spread evenly over the replicas (the same checkpoint).")
    group.add_argument("--ckpt-fully-parallel-save", action="store_true",
                       dest="ckpt_fully_parallel_save_deprecated",
                       help="Deprecated, no effect (fully parallel saving is the default).")
    group.add_argument("--ckpt-fully-parallel-load", action="store_true",
                       help="Each data-parallel replica reads a share of the checkpoint and "
                            "they exchange it, instead of every rank reading all it needs.")
    group.add_argument("--dist-ckpt-strictness", default=DEFAULT_STRICTNESS,
                       choices=STRICTNESS_CHOICES,
                       help="What a load does with keys the checkpoint and the model do not "
                            "share (megatron-core's StrictHandling; return_* refused).")
    group.add_argument("--persistent-save-interval", type=int, dest="save_interval",
                       default=None, help="Megatron-LM's other name of --save-interval.")
    group.add_argument("--dist-ckpt-optim-fully-reshardable", action="store_true",
                       help="Save the distributed optimizer's state fully reshardable "
                            "(megatron-core's fully_reshardable: a resume may change TP, PP, "
                            "EP, expert TP and the virtual pipeline) instead of resharding "
                            "over data-parallel ranks only (dp_reshardable).")
    group.add_argument("--distrib-optim-fully-reshardable-mem-efficient", action="store_true",
                       help="With --dist-ckpt-optim-fully-reshardable: gather the state over "
                            "gloo to data-parallel rank 0 alone (less memory, no parallel "
                            "save; the same checkpoint content).")
    group.add_argument("--use-dist-ckpt", action="store_true", dest="use_dist_ckpt_deprecated",
                       help="Deprecated, no effect (as in Megatron-LM): --ckpt-format selects "
                            "the format.")
    group.add_argument("--dist-ckpt-format", default=None, dest="dist_ckpt_format_deprecated",
                       help="Deprecated, no effect (as in Megatron-LM): --ckpt-format selects "
                            "the format.")
    group.add_argument("--ckpt-assume-constant-structure", action="store_true",
                       help="Accepted: Megatron-LM caches the save plan with it; the checkpoint "
                            "is the same, and each save here is planned afresh.")
    group.add_argument("--no-strict-fsdp-dtensor-load", "--disable-strict-fsdp-dtensor-load",
                       action="store_false", dest="strict_fsdp_dtensor_load",
                       help="Accepted, no effect: read only for fsdp_dtensor checkpoints, "
                            "which are refused here.")
    add_flag_rows(parser.add_argument_group("Megatron-LM checkpoint flags refused here"),
                  REFUSED_FLAGS)


def deprecation_notes(args: argparse.Namespace) -> list[str]:
    """Megatron-LM's lines for the deprecated checkpoint flags given (printed at start-up)."""
    notes = [DEPRECATED_FLAG_NOTE.format(flag=flag) for flag, given in (
        ("--use-dist-ckpt", args.use_dist_ckpt_deprecated),
        ("--dist-ckpt-format", args.dist_ckpt_format_deprecated)) if given]
    if args.ckpt_fully_parallel_save_deprecated:
        notes.insert(0, FULLY_PARALLEL_SAVE_NOTE)
    return notes


def validate_checkpoint_save_args(args: argparse.Namespace, require) -> None:
    """Refuses what cannot be honoured (``require(cond, message)``)."""
    refuse_given(args, REFUSED_FLAGS, require)
    require(args.dist_ckpt_strictness not in _RETURNING_STRICTNESS,
            f"--dist-ckpt-strictness {args.dist_ckpt_strictness} is not supported: it only "
            f"hands the mismatching keys to a caller; use raise_all to stop on them or "
            f"log_all to list them")
    for note in deprecation_notes(args):
        warning_rank_0(note)
