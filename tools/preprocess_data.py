"""JSONL text -> Megatron indexed datasets (.bin/.idx) for ``--data-path``, with Megatron-LM's
flags; the work is in megatron/varlen_training/datasets/preprocess.py, this is its command line.

    python tools/preprocess_data.py --input docs.jsonl --json-keys text \\
        --tokenizer-type ByteLevelTokenizer --append-eod --output-prefix data/docs --workers 4

writes ``data/docs_text_document.bin/.idx``; train on them with ``--data-path
data/docs_text_document``. Progress: a bar with documents/s on a terminal, and Megatron-LM's
``Processed N documents (D docs/s, M MB/s).`` line every ``--log-interval`` documents and at
the end. A bad flag or line is one line (``preprocess_data.py: error: FILE:LINE: ...``) and
exit code 2. Imports only the installed package (no ``tools.*``), so it runs from the repository
root in any environment where the package is installed.
"""

from __future__ import annotations

if not __package__:  # run as `python tools/X.py`: the repository root on sys.path
    import _repo_root  # noqa: F401

import argparse
import sys

from megatron.varlen_training.warning_filters import silence_known_warnings

silence_known_warnings()  # before megatron-core's import-time notes about Apex/TE

from megatron.varlen_training.datasets.preprocess import (  # noqa: E402
    PreprocessConfig, preprocess,
)
from megatron.varlen_training.errors import USAGE_EXIT_CODE, one_line  # noqa: E402
from megatron.varlen_training.flag_errors import ArgumentValidationError  # noqa: E402
from megatron.varlen_training.tokenizer import TOKENIZER_TYPES  # noqa: E402

PROG = "preprocess_data.py"
DEFAULT_LOG_INTERVAL = 1000  # Megatron-LM's


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):  # noqa: D401 - argparse override
        raise ArgumentValidationError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog=PROG, allow_abbrev=False,
                            description="JSONL text -> Megatron indexed datasets (.bin/.idx) "
                                        "for --data-path")
    group = parser.add_argument_group("input data")
    group.add_argument("--input", required=True, help="JSONL file: one JSON object per line.")
    group.add_argument("--json-keys", nargs="+", default=["text"],
                       help="Keys whose text becomes documents (one dataset per key).")
    group = parser.add_argument_group("tokenizer")
    group.add_argument("--tokenizer-type", required=True, choices=TOKENIZER_TYPES,
                       help="The tokenizer training will use (pretrain_gpt.py's flag).")
    group.add_argument("--tokenizer-model", default=None,
                       help="Local tokenizer directory (HuggingFaceTokenizer).")
    group.add_argument("--vocab-size", type=int, default=None,
                       help="Vocabulary size (NullTokenizer).")
    group.add_argument("--append-eod", action="store_true",
                       help="End every document with the tokenizer's eod id.")
    group = parser.add_argument_group("output data")
    group.add_argument("--output-prefix", required=True,
                       help="Writes OUTPUT_PREFIX_{key}_document.bin/.idx.")
    group = parser.add_argument_group("runtime")
    group.add_argument("--workers", type=int, required=True,
                       help="Tokenizing processes (the files do not depend on it).")
    group.add_argument("--log-interval", type=int, default=DEFAULT_LOG_INTERVAL,
                       help="Print the progress line every N documents.")
    return parser


def parse_config(argv: list[str] | None = None) -> PreprocessConfig:
    args = build_parser().parse_args(argv)
    return PreprocessConfig(
        input=args.input, json_keys=tuple(args.json_keys), tokenizer_type=args.tokenizer_type,
        output_prefix=args.output_prefix, tokenizer_model=args.tokenizer_model,
        vocab_size=args.vocab_size, append_eod=args.append_eod, workers=args.workers,
        log_interval=args.log_interval)


def main(argv: list[str] | None = None) -> int:
    """Runs the tool; returns its exit code (0, or 2 after one error line on stderr)."""
    from tqdm import tqdm  # the progress bar only; shown on a terminal

    try:
        config = parse_config(argv)
        with tqdm(desc="preprocess", unit=" docs", file=sys.stderr, disable=None,
                  mininterval=0.5) as bar:
            summary = preprocess(config, bar)
    except (ValueError, OSError) as err:
        print(f"{PROG}: error: {one_line(err)}", file=sys.stderr, flush=True)
        return USAGE_EXIT_CODE
    print(summary.progress_line(), file=sys.stderr, flush=True)
    for key, prefix in summary.prefixes.items():
        print(f"{key}: {summary.documents[key]} documents, {summary.tokens[key]} tokens -> "
              f"{prefix}.bin/.idx (train with --data-path {prefix})")
    if summary.empty:
        print(f"{summary.empty} text(s) had no tokens and added no document")
    return 0


if __name__ == "__main__":
    sys.exit(main())
