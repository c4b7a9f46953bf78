"""Megatron-LM's training-loop flags of its ``_add_training_args`` (core_v0.16.1's
TrainingConfig) that this fork's loop does not implement: registered so that a Megatron-LM
command line carrying one gets a line naming the flag and why (exit 2) instead of argparse's
"unrecognized arguments"; their defaults (not given, or an empty list) are accepted.
(The runtime, kernel and logging flags of the same group live in their own modules;
``--moe-layer-recompute`` is honoured in recompute_arguments.py.)"""

from __future__ import annotations

import argparse

from megatron.varlen_training.refused_flags import SWITCH, FlagRow, add_flag_rows, refuse_given

_NOT_IMPLEMENTED = "this fork's training loop does not implement it"
REFUSED_FLAGS = (
    # Iteration numbers, refused whatever they are: kept as text (no range to check).
    FlagRow(("--iterations-to-skip",), {"nargs": "+"}, None,
            "every iteration trains here (no iteration is skipped)"),
    FlagRow(("--train-sync-interval",), {"type": int}, None, _NOT_IMPLEMENTED),
    # --decrease-batch-size-if-needed: honoured with --rampup-batch-size
    # (schedule_arguments.py).
    # --check-weight-hash-across-dp-replicas-interval and --result-rejected-tracker-filename:
    # refused with the rerun / fault-tolerance families (runtime_arguments.py).
    FlagRow(("--high-priority-stream-groups",), {"nargs": "*"}, None,
            "communication runs on megatron-core's default streams here", accepts=("",)),
    FlagRow(("--disable-gloo-process-groups",), SWITCH, False,
            "megatron-core's process groups are created as it defaults here"),
)


def add_training_loop_args(parser: argparse.ArgumentParser) -> None:
    add_flag_rows(parser.add_argument_group("Megatron-LM training-loop flags refused here"),
                  REFUSED_FLAGS)


def validate_training_loop_args(args: argparse.Namespace, require) -> None:
    refuse_given(args, REFUSED_FLAGS, require)
