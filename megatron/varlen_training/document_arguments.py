"""Flags for the documents inside pretraining samples: Megatron-LM's ``--reset-position-ids``,
``--reset-attention-mask`` and ``--eod-mask-loss`` (same names and semantics), and this fork's
``--packing-unit`` (how ``--sequence-packing`` cuts pretraining data) and
``--document-piece-length`` (where whole documents are cut). How they work:
``megatron/varlen_training/datasets/documents.py``, ``datasets/whole_documents.py`` and
docs/PACKING.md.
"""

from __future__ import annotations

from megatron.varlen.platform import LOCAL
from megatron.varlen_training.datasets.whole_documents import longest_sequence
from megatron.varlen_training.varlen_arguments import possible_cp_sizes, sp_factor

PACKING_UNIT_SAMPLE = "sample"
PACKING_UNIT_DOCUMENT = "document"
PACKING_UNITS = (PACKING_UNIT_SAMPLE, PACKING_UNIT_DOCUMENT)


def add_document_args(parser) -> None:
    """Registers the document flags on ``parser``."""
    group = parser.add_argument_group("documents in pretraining samples")
    group.add_argument("--reset-position-ids", action="store_true",
                       help="Positions restart at 0 after every end-of-document token "
                            "(Megatron-LM's flag).")
    group.add_argument("--reset-attention-mask", action="store_true",
                       help="No attention across end-of-document tokens (Megatron-LM's flag): "
                            "a dense per-sample mask on the unpacked path; with "
                            "--sequence-packing every document is its own THD sequence "
                            "instead.")
    group.add_argument("--eod-mask-loss", action="store_true",
                       help="No loss where the input token is end-of-document (Megatron-LM's "
                            "flag), packed or not.")
    group.add_argument("--packing-unit", default=PACKING_UNIT_SAMPLE, choices=PACKING_UNITS,
                       help="With --sequence-packing on pretraining data: sample = Megatron's "
                            "--seq-length samples, each cut at its end-of-document tokens into "
                            "documents (one THD sequence each); document = whole documents, "
                            "never cut at --seq-length, up to the longest sequence the layout "
                            "runs (longer ones are cut there); a blend's weights are then "
                            "shares of training tokens.")
    group.add_argument("--document-piece-length", type=int, default=None, metavar="N",
                       help="With --packing-unit document: cut documents into pieces of at "
                            "most N training tokens (default: the longest sequence the layout "
                            "runs, which is also the most N may be). A resume keeps the "
                            "checkpoint's pieces on a layout that runs longer sequences with "
                            "the checkpoint's value.")


def validate_document_args(args, require, attention_backend: str) -> None:
    """Checks the document flags; ``attention_backend``: the resolved core attention."""
    resets = [flag for flag, on in (("--reset-position-ids", args.reset_position_ids),
                                    ("--reset-attention-mask", args.reset_attention_mask),
                                    ("--eod-mask-loss", args.eod_mask_loss)) if on]
    require(not (resets and args.sft),
            f"{resets[0] if resets else ''} applies to pretraining data, not --sft (an SFT "
            f"sample is one conversation whose loss mask the chat template decides)")
    if args.packing_unit == PACKING_UNIT_DOCUMENT:
        require(args.sequence_packing and not args.sft and not args.mock_data,
                "--packing-unit document packs whole documents of indexed pretraining data: "
                "it needs --sequence-packing (or --dynamic-context-parallel), --data-path "
                "PREFIX and neither --sft nor --mock-data")
        _validate_piece_length(args, require)
    else:
        require(args.document_piece_length is None,
                "--document-piece-length cuts whole documents: it needs --packing-unit document")
    if args.sequence_packing and not args.sft:
        _validate_packed_positions(args, require)
    if args.reset_attention_mask and not args.sequence_packing:
        require(attention_backend == LOCAL,
                f"--reset-attention-mask without --sequence-packing needs a dense per-sample "
                f"mask, which only --attention-backend local applies (this run resolves to "
                f"{attention_backend}): pack the documents (--sequence-packing) or pass "
                f"--attention-backend local")


def _validate_piece_length(args, require) -> None:
    """A piece must run as one sequence: at most the layout's longest (its budget on its
    largest CP group, learned positions' table)."""
    if args.document_piece_length is None:
        return
    learned = args.position_embedding_type == "learned_absolute"
    longest = longest_sequence(args.max_seqlen_per_dp_cp_rank, possible_cp_sizes(args),
                               sp_factor(args),
                               args.max_position_embeddings if learned else None)
    require(args.document_piece_length <= longest,
            f"--document-piece-length {args.document_piece_length} is longer than the longest "
            f"sequence this layout runs ({longest} tokens: --max-seqlen-per-dp-cp-rank "
            f"{args.max_seqlen_per_dp_cp_rank} on its largest CP group"
            f"{', at most --max-position-embeddings' if learned else ''}): lower it, or raise "
            f"--max-seqlen-per-dp-cp-rank or the CP size")


def _validate_packed_positions(args, require) -> None:
    """A packed document restarts its positions; a packed whole sample counts 0..s-1. With
    learned absolute positions (the only kind that reads position ids) the two flags must then
    agree, or the packed run would not be the unpacked run the flags describe."""
    if args.position_embedding_type != "learned_absolute":
        return
    require(args.reset_position_ids or not args.reset_attention_mask,
            "--reset-attention-mask with --sequence-packing packs every document as its own "
            "sequence, whose positions restart at 0: add --reset-position-ids (learned absolute "
            "positions read them)")
    require(args.reset_attention_mask or not args.reset_position_ids,
            "--reset-position-ids with --sequence-packing but without --reset-attention-mask: "
            "a packed sample keeps positions 0..s-1; add --reset-attention-mask (every document "
            "its own sequence) or leave out --sequence-packing")
