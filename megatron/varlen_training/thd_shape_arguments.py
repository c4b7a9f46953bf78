"""Megatron-LM's fixed-THD-shape flags and ``--cp-comm-type``: their names, values and checks.

``--pad-packed-seq-alignment {N,max}``, ``--thd-max-packed-sequences K`` and
``--thd-tail-padding-policy {append_dummy_seq,extend_last}`` shape every packed micro-batch
(megatron/varlen/packing/thd_shapes.py, docs/PACKING.md). ``--cp-comm-type`` names how attention
exchanges K/V under context parallelism: this fork all-gathers them, so ``all_gather`` is the
one value accepted; the others are refused at start-up, never silently ignored.
"""

from __future__ import annotations

import argparse

from megatron.varlen.packing import (
    ALIGN_TO_BUDGET, APPEND_DUMMY_SEQ, EXTEND_LAST, TAIL_PADDING_POLICIES,
)
from megatron.varlen.platform import TE
from megatron.varlen.scheduling import pad_multiple

ALIGNMENT_FLAG = "--pad-packed-seq-alignment"
MAX_SEQUENCES_FLAG = "--thd-max-packed-sequences"
TAIL_POLICY_FLAG = "--thd-tail-padding-policy"
CP_COMM_TYPE_FLAG = "--cp-comm-type"
ALL_GATHER = "all_gather"
# Megatron-LM's values (megatron-core's TransformerConfig.cp_comm_type); only ALL_GATHER runs here.
UPSTREAM_CP_COMM_TYPES = ("p2p", ALL_GATHER, "a2a", "a2a+p2p")


def parse_alignment(value: str) -> int | str:
    """``--pad-packed-seq-alignment``'s type: ``max`` or an integer (range checked later)."""
    if value == ALIGN_TO_BUDGET:
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} must be 'max' or a positive integer") from None


def add_thd_shape_args(parser) -> None:
    """Registers the fixed-THD-shape flags and ``--cp-comm-type`` on ``parser``."""
    group = parser.add_argument_group("fixed THD shapes and CP exchange (Megatron-LM's flags)")
    group.add_argument(ALIGNMENT_FLAG, type=parse_alignment, default=None, metavar="{N,max}",
                       help="Pad every rank's share of a packed micro-batch at its end: max = to "
                            "exactly --max-seqlen-per-dp-cp-rank tokens (fixed shapes for CUDA "
                            "graphs / torch.compile), N = to a multiple of N.")
    group.add_argument(MAX_SEQUENCES_FLAG, type=int, default=None,
                       help="At most this many sequences per rank in a packed micro-batch, the "
                            "dummy padding sequence included; cu_seqlens then have exactly this "
                            "many + 1 entries (unused ones repeat the last boundary).")
    group.add_argument(TAIL_POLICY_FLAG, default=None, choices=TAIL_PADDING_POLICIES,
                       help="How --pad-packed-seq-alignment's padding is laid out: "
                            "append_dummy_seq (default) = one more sequence of pad tokens; "
                            "extend_last = more padding of the pack's last sequence.")
    group.add_argument(CP_COMM_TYPE_FLAG, nargs="+", default=None, metavar="TYPE",
                       help="How attention exchanges K/V under context parallelism (one value, "
                            "or one per layer). Only all_gather is implemented (what runs without "
                            "the flag): "
                            "p2p, a2a and a2a+p2p are refused.")


def _pads_tail(args) -> bool:
    """Whether packs get tail padding (the flag, or virtual pipeline stages' fixed shapes)."""
    return (args.pad_packed_seq_alignment is not None
            or bool(args.virtual_pipeline_model_parallel_size))


def _tail_unit(args, possible_cp_sizes: list[int]) -> int:
    """What a rank's padded token count must be a multiple of: the tail is a sequence (or part
    of one) split into 2 x CP chunks, each split by the sequence-parallel factor."""
    sp_factor = args.tensor_model_parallel_size if args.sequence_parallel else 1
    return max(pad_multiple(size, sp_factor) // size for size in possible_cp_sizes)


def _validate_alignment(args, require, possible_cp_sizes: list[int]) -> None:
    alignment, budget = args.pad_packed_seq_alignment, args.max_seqlen_per_dp_cp_rank
    if alignment is None:
        return
    unit = _tail_unit(args, possible_cp_sizes)
    if alignment == ALIGN_TO_BUDGET:
        require(budget % unit == 0,
                f"{ALIGNMENT_FLAG} max pads every rank to --max-seqlen-per-dp-cp-rank {budget} "
                f"tokens, which must then be a multiple of {unit} (the padding is split like a "
                f"sequence: 2 x CP chunks x the sequence-parallel factor)")
        return
    require(alignment >= 1, f"{ALIGNMENT_FLAG} {alignment} must be 'max' or a positive integer")
    require(alignment <= budget,
            f"{ALIGNMENT_FLAG} {alignment} exceeds --max-seqlen-per-dp-cp-rank {budget} "
            f"(lower it, or use {ALIGNMENT_FLAG} max)")
    require(alignment % unit == 0,
            f"{ALIGNMENT_FLAG} {alignment} must be a multiple of {unit} (the padding is split "
            f"like a sequence: 2 x CP chunks x the sequence-parallel factor)")
    require(not args.virtual_pipeline_model_parallel_size or budget % alignment == 0,
            f"with virtual pipeline stages every pack is padded to --max-seqlen-per-dp-cp-rank "
            f"{budget} tokens, which {ALIGNMENT_FLAG} {alignment} must divide (or use max)")


def _validate_max_sequences(args, require) -> None:
    cap, budget = args.thd_max_packed_sequences, args.max_seqlen_per_dp_cp_rank
    if cap is None:
        return
    dummy = _pads_tail(args) and (args.thd_tail_padding_policy or APPEND_DUMMY_SEQ) != EXTEND_LAST
    require(cap >= 2 or not dummy,
            f"{MAX_SEQUENCES_FLAG} {cap} leaves no slot for a real sequence beside the dummy "
            f"padding sequence ({TAIL_POLICY_FLAG} {APPEND_DUMMY_SEQ}): raise it to 2 or more, "
            f"or use {TAIL_POLICY_FLAG} {EXTEND_LAST}")
    # Every sequence takes at least one of a rank's `budget` tokens, plus the dummy: a larger
    # cap only allocates cu_seqlens entries that can never be used.
    require(cap <= budget + 1,
            f"{MAX_SEQUENCES_FLAG} {cap} exceeds the sequences a rank's pack can hold "
            f"(--max-seqlen-per-dp-cp-rank {budget} tokens: at most {budget + 1} with the "
            f"dummy padding sequence); lower it")


def _validate_mtp_with_te(args, require, possible_cp_sizes: list[int],
                          attention_backend: str) -> None:
    """Our attentions hand MTP the host boundaries (one entry per sequence); with TE's, MTP's
    roll reads the fixed-size device cu_seqlens, and megatron-core's roll cannot split their
    zero-length entries for CP."""
    require(not (args.thd_max_packed_sequences is not None and args.mtp_num_layers
                 and attention_backend == TE and max(possible_cp_sizes) > 1),
            f"{MAX_SEQUENCES_FLAG} with --mtp-num-layers under context parallelism needs "
            f"--attention-backend local or flash (with te, megatron-core's MTP roll reads the "
            f"fixed-size cu_seqlens, whose zero-length entries it cannot split for CP)")


def validate_thd_shape_args(args, require, possible_cp_sizes: list[int],
                            attention_backend: str) -> None:
    """Checks the fixed-THD-shape flags once the packing flags are resolved (the budget set)."""
    given = [flag for flag, dest in ((ALIGNMENT_FLAG, "pad_packed_seq_alignment"),
                                     (MAX_SEQUENCES_FLAG, "thd_max_packed_sequences"),
                                     (TAIL_POLICY_FLAG, "thd_tail_padding_policy"))
             if getattr(args, dest) is not None]
    if not args.sequence_packing:
        for flag in given[:1]:
            require(False, f"{flag} needs --sequence-packing")
        return
    _validate_alignment(args, require, possible_cp_sizes)
    require(args.thd_tail_padding_policy is None or _pads_tail(args),
            f"{TAIL_POLICY_FLAG} needs {ALIGNMENT_FLAG} (it lays out that padding)")
    _validate_max_sequences(args, require)
    _validate_mtp_with_te(args, require, possible_cp_sizes, attention_backend)


def validate_cp_comm_type(args, require, attention_backend: str) -> None:
    """``--cp-comm-type``: only what runs is accepted (``all_gather``), one value or one per
    layer; with Transformer Engine's attention the exchange is TE's own, so it is refused."""
    values = args.cp_comm_type
    if values is None:
        return
    for value in values:
        known = value in UPSTREAM_CP_COMM_TYPES
        require(value == ALL_GATHER,
                f"{CP_COMM_TYPE_FLAG} {value} is {'not implemented' if known else 'unknown'}: "
                f"context parallelism here all-gathers K and V over each micro-batch's CP group "
                f"(supported: {ALL_GATHER})")
    require(len(values) in (1, args.num_layers),
            f"{CP_COMM_TYPE_FLAG} has {len(values)} values: give one, or one per layer "
            f"(--num-layers {args.num_layers})")
    require(attention_backend != TE,
            f"{CP_COMM_TYPE_FLAG} applies to the local and flash attention backends; with "
            f"--attention-backend te, Transformer Engine runs its own CP exchange (drop "
            f"{CP_COMM_TYPE_FLAG})")
