"""Megatron-LM's data-loader and dataset-builder flags (its ``_add_data_args`` and
``--dataloader-type``) beyond data_arguments.py: honoured, accepted as a proven no-op, or
refused in one line.

- ``--dataloader-type``: ``single`` (Megatron-LM's default once resolved): every sample once
  per pass, in the dataset's order, continued on resume. ``cyclic`` (reshuffled every epoch)
  and ``external`` (the caller's own loader) are refused.
- ``--num-dataset-builder-threads``, ``--mid-level-dataset-surplus``,
  ``--allow-ambiguous-pad-tokens``: megatron-core's BlendedMegatronDatasetConfig fields of the
  same names, for indexed data (datasets/indexed.py).
- ``--no-create-attention-mask-in-dataloader``: no effect here, as this fork's data never
  carries Megatron-LM's dense causal mask (THD sequence boundaries and the causal attention
  say the same; a test shows the run unchanged). Refused beside ``--reset-attention-mask``
  without packing, where Megatron-LM would drop the per-document mask this fork builds.
- The FIM tuning flags are read by Megatron-LM only with ``--fim-data`` (refused); the
  remaining data-source flags are refused with the way out.
"""

from __future__ import annotations

import argparse

from megatron.varlen_training.refused_flags import (
    SWITCH, FlagRow, accepted_rows, add_flag_rows, read_only_with, refuse_given,
)

SINGLE = "single"  # the one --dataloader-type this fork's loader implements
DATALOADER_TYPES = (SINGLE, "cyclic", "external")
BUILDER_THREADS_DEFAULT = 1  # Megatron-LM's and megatron-core's
MID_LEVEL_SURPLUS_DEFAULT = 0.005  # Megatron-LM's and megatron-core's
_PATHS_WHY = ("give the data with --data-path or --train-data-path / --valid-data-path / "
              "--test-data-path")
_CACHE_WHY = ("megatron-core's index caches are built (or found and checked) at start-up "
              "here, rank by rank; the pre-built-cache fast paths are not wired")
REFUSED_FLAGS = (
    FlagRow(("--data-args-path",), {}, None, _PATHS_WHY),
    FlagRow(("--per-split-data-args-path",), {}, None, _PATHS_WHY),
    FlagRow(("--per-dataset-sequences-path",), {}, None,
            "dataset sizes are read from the .idx files"),
    FlagRow(("--object-storage-cache-path",), {}, None, "data is read from local files only"),
    FlagRow(("--phase-transition-iterations",), {}, None,
            "one data blend per run here (Megatron-LM main only)"),
    FlagRow(("--dataloader-fast-cache-load",), SWITCH, False, _CACHE_WHY),
    FlagRow(("--dataloader-defer-npy-index-mmap",), SWITCH, False, _CACHE_WHY),
    FlagRow(("--fim-data",), SWITCH, False, "fill-in-the-middle samples are not built here"),
)
# Read by Megatron-LM only with --fim-data (refused).
_UNREAD = read_only_with("--fim-data")
_FIM_TUNING_FLAGS = accepted_rows(
    FlagRow(("--fim-rate",), {"type": float}, 0.5, _UNREAD),
    FlagRow(("--fim-spm-rate",), {"type": float}, 0.5, _UNREAD),
    FlagRow(("--fim-split-sample",), {}, None, _UNREAD),
    FlagRow(("--fim-fragment-rate",), {"type": float}, None, _UNREAD),
    FlagRow(("--fim-no-prefix",), {}, None, _UNREAD),
    FlagRow(("--fim-prefix-token",), {}, "<fim_prefix>", _UNREAD),
    FlagRow(("--fim-middle-token",), {}, "<fim_middle>", _UNREAD),
    FlagRow(("--fim-suffix-token",), {}, "<fim_suffix>", _UNREAD),
    FlagRow(("--fim-pad-token",), {}, "<fim_pad>", _UNREAD),
    FlagRow(("--fim-eod-token",), {}, "<|endoftext|>", _UNREAD),
)


def add_dataloader_args(parser: argparse.ArgumentParser) -> None:
    """Registers the data-loader and dataset-builder flags."""
    group = parser.add_argument_group("data loader and dataset builder")
    group.add_argument("--dataloader-type", default=None, choices=DATALOADER_TYPES,
                       help="single (the default): each sample once per pass, in order, "
                            "continued on resume; cyclic and external are refused.")
    group.add_argument("--num-dataset-builder-threads", type=int,
                       default=BUILDER_THREADS_DEFAULT,
                       help="Threads building a blend's datasets (megatron-core's builder).")
    group.add_argument("--mid-level-dataset-surplus", type=float,
                       default=MID_LEVEL_SURPLUS_DEFAULT,
                       help="Extra share of samples built for each dataset of a blend, as "
                            "megatron-core's.")
    group.add_argument("--allow-ambiguous-pad-tokens", action="store_true",
                       help="Keep the loss on dataset tokens equal to a pad id that another "
                            "special token shares (megatron-core's GPT dataset).")
    group.add_argument("--no-create-attention-mask-in-dataloader", action="store_false",
                       dest="create_attention_mask_in_dataloader",
                       help="Accepted, no effect: the data here never carries a dense causal "
                            "mask (refused with --reset-attention-mask unpacked).")
    add_flag_rows(group, _FIM_TUNING_FLAGS)
    add_flag_rows(parser.add_argument_group("Megatron-LM data flags refused here"),
                  REFUSED_FLAGS)


def validate_dataloader_args(args: argparse.Namespace, require) -> None:
    """Refuses what this data path cannot do; resolves --dataloader-type as Megatron-LM does
    (``require(cond, message)``)."""
    refuse_given(args, REFUSED_FLAGS, require)
    if args.dataloader_type is None:
        args.dataloader_type = SINGLE
    require(args.dataloader_type == SINGLE,
            f"--dataloader-type {args.dataloader_type} is not supported: this fork's loader "
            f"reads each sample once per pass in the dataset's order (single); use "
            f"--dataloader-type single")
    require(args.create_attention_mask_in_dataloader or not args.reset_attention_mask
            or args.sequence_packing,
            "--no-create-attention-mask-in-dataloader with --reset-attention-mask and no "
            "--sequence-packing: Megatron-LM would then build no per-document mask, which this "
            "run applies; drop --no-create-attention-mask-in-dataloader or pack the documents")
