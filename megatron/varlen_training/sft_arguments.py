"""Where ``--sft --data-path`` records keep their conversation: the JSONL keys, or the
Parquet/Arrow columns (:mod:`megatron.varlen_training.datasets.sft_arrow`).

A record holds either a list of ``{"role", "content"}`` messages (``--sft-messages-key``,
default ``messages``; looked for first) or a prompt and a response (``--sft-prompt-key``,
``--sft-response-key``, defaults ``prompt`` and ``response``). Megatron-LM's own SFT dataset
reads a fixed ``messages`` key and has no such flags; the names follow its ``--json-keys``.

The checks also cover ``--sft --data-path`` itself: one entry (SFT data is not blended; several
used to train on the first alone after a warning) and a ``--split`` that parses (it splits the
file's samples by position, ``datasets/builder.py``'s ``sft_split``).
"""

from __future__ import annotations

from megatron.varlen_training.data_arguments import parse_split


def add_sft_data_args(parser) -> None:
    group = parser.add_argument_group("SFT data keys")
    group.add_argument("--sft-messages-key", default="messages",
                       help="JSONL key / Parquet or Arrow column of a record's messages "
                            "(a list of {role, content}).")
    group.add_argument("--sft-prompt-key", default="prompt",
                       help="Key / column of the prompt (a user turn), used when a record has "
                            "no messages.")
    group.add_argument("--sft-response-key", default="response",
                       help="Key / column of the response (the assistant turn, trained on).")


def validate_sft_data_args(args, require) -> None:
    """Keys are non-empty, and the prompt and response are two different ones."""
    for flag, key in (("--sft-messages-key", args.sft_messages_key),
                      ("--sft-prompt-key", args.sft_prompt_key),
                      ("--sft-response-key", args.sft_response_key)):
        require(key.strip() != "", f"{flag} {key!r} is empty (name a key or column)")
    _validate_sft_data_path(args, require)
    require(args.sft_prompt_key != args.sft_response_key,
            f"--sft-prompt-key and --sft-response-key are both {args.sft_prompt_key!r} (the "
            "prompt and the response need their own keys)")


def _validate_sft_data_path(args, require) -> None:
    """``--sft --data-path`` names one file or folder (it used to read the first entry of
    several with only a warning), and ``--split`` must parse (it splits the file)."""
    if not args.sft or args.mock_data or not args.data_path:
        return
    require(len(args.data_path) == 1,
            f"--sft reads one --data-path entry, got {len(args.data_path)} "
            f"({' '.join(args.data_path)}): SFT data is not blended; concatenate the JSONL files "
            "or put the Parquet shards in one folder")
    if args.split is not None:
        try:
            parse_split(args.split)
        except ValueError as err:
            require(False, str(err))
