"""JSONL text -> Megatron indexed datasets (.bin/.idx) for ``--data-path``, with Megatron-LM's
flags; the work is in megatron/varlen_training/datasets/preprocess.py, this is its command line.

    python tools/preprocess_data.py --input docs.jsonl --json-keys text \\
        --tokenizer-type ByteLevelTokenizer --append-eod --output-prefix data/docs --workers 4

writes ``data/docs_text_document.bin/.idx``, the files Megatron-LM's tools/preprocess_data.py writes
for the same flags; train on them with ``--data-path data/docs_text_document``. Megatron-LM's GPT
recipe, ``--tokenizer-type GPT2BPETokenizer --vocab-file gpt2-vocab.json --merge-file
gpt2-merges.txt``, works as in pretrain_gpt.py, and so do its SentencePiece types and TikTokenizer
(``--tokenizer-model FILE``, ids without a BOS as Megatron-LM's); its tokenizer types and flags
not honoured here are refused in one line (megatron/varlen_training/tokenizer_arguments.py).
Megatron-LM's flags this tool does not do (``--split-sentences`` and its ``--keep-newlines``,
``--lang``; ``--find-optimal-num-workers`` and its ``--workers-to-check``, ``--max-documents``) are
refused in one line saying what to do instead. Progress: a bar with documents/s on a terminal, and
Megatron-LM's ``Processed N documents (D docs/s, M MB/s).`` line every ``--log-interval`` documents
and at the end. A bad flag or line is one line (``preprocess_data.py: error: FILE:LINE: ...``) and
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
from megatron.varlen_training.flag_errors import ArgumentValidationError, require  # noqa: E402
from megatron.varlen_training.model_file_tokenizers import ModelFileOptions  # noqa: E402
from megatron.varlen_training.refused_flags import (  # noqa: E402
    SWITCH, FlagRow, add_flag_rows, refuse_given,
)
from megatron.varlen_training.tokenizer import TOKENIZER_TYPE_CHOICES  # noqa: E402
from megatron.varlen_training.tokenizer_arguments import (  # noqa: E402
    add_tokenizer_file_args, validate_tokenizer_args,
)

PROG = "preprocess_data.py"
DEFAULT_LOG_INTERVAL = 1000  # Megatron-LM's
# Megatron-LM's flags without an implementation here (no value of them changes nothing).
_SENTENCES_HINT = ("split the text into sentences beforehand and give each document as a JSON "
                   "list of its sentences (each becomes one sequence of the document)")
_TUNING_HINT = "time a few --workers values on a sample of the input instead"
_SENTENCES_ONLY = ("it only applies to --split-sentences, which is not supported; "
                   + _SENTENCES_HINT)
_SEARCH_ONLY = ("it only applies to --find-optimal-num-workers, which is not supported; "
                + _TUNING_HINT)
_REFUSED_FLAGS = (
    FlagRow(("--split-sentences",), SWITCH, False,
            f"nltk sentence splitting is not built here; {_SENTENCES_HINT}"),
    FlagRow(("--keep-newlines",), SWITCH, False, _SENTENCES_ONLY),
    FlagRow(("--lang",), {}, None, _SENTENCES_ONLY),
    FlagRow(("--find-optimal-num-workers",), SWITCH, False,
            f"the worker search is not built here; {_TUNING_HINT}"),
    FlagRow(("--workers-to-check",), {"nargs": "+"}, None, _SEARCH_ONLY),
    FlagRow(("--max-documents",), {}, None, _SEARCH_ONLY),
)


# Megatron-LM tokenizer flags the training layer refuses but this tool honours (its own group).
_HONOURED_TOKENIZER_FLAGS = ("--tokenizer-hf-no-include-special-tokens",)


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
    group.add_argument("--tokenizer-type", required=True, choices=TOKENIZER_TYPE_CHOICES,
                       help="The tokenizer training will use (pretrain_gpt.py's flag).")
    group.add_argument("--tokenizer-model", default=None,
                       help="HuggingFaceTokenizer: a local tokenizer directory; SentencePiece "
                            "types: the .model file; TikTokenizer: the vocabulary JSON (refused "
                            "beside another type).")
    group.add_argument("--vocab-size", type=int, default=None,
                       help="Vocabulary size (NullTokenizer).")
    group.add_argument("--append-eod", action="store_true",
                       help="End every document with the tokenizer's eod id.")
    group.add_argument("--tokenizer-hf-no-include-special-tokens", action="store_true",
                       help="HuggingFaceTokenizer: ids without the tokenizer's special tokens "
                            "(no BOS); by default tokenizer(text).input_ids, as Megatron-LM.")
    group.add_argument("--tokenizer-hf-include-special-tokens", action="store_true",
                       help="Megatron-LM's older flag for the default (accepted, no effect).")
    add_tokenizer_file_args(parser, honoured=_HONOURED_TOKENIZER_FLAGS)
    group = parser.add_argument_group("output data")
    group.add_argument("--output-prefix", required=True,
                       help="Writes OUTPUT_PREFIX_{key}_document.bin/.idx.")
    group = parser.add_argument_group("runtime")
    group.add_argument("--workers", type=int, required=True,
                       help="Tokenizing processes (the files do not depend on it).")
    group.add_argument("--log-interval", type=int, default=DEFAULT_LOG_INTERVAL,
                       help="Print the progress line every N documents.")
    group.add_argument("--partitions", type=int, default=1,
                       help="Megatron-LM's partitions: line i goes to partition i mod N and the "
                            "output holds partition 0's documents, then 1's, ... (the files "
                            "Megatron-LM merges); --workers must be a multiple of it.")
    group.add_argument("--keep-sequential-samples", action="store_true",
                       help="Partitions of consecutive lines: the input order.")
    add_flag_rows(parser.add_argument_group("Megatron-LM flags refused here"), _REFUSED_FLAGS)
    return parser


def parse_config(argv: list[str] | None = None) -> PreprocessConfig:
    args = build_parser().parse_args(argv)
    refuse_given(args, _REFUSED_FLAGS, require)
    validate_tokenizer_args(args, require, honoured=_HONOURED_TOKENIZER_FLAGS)
    return PreprocessConfig(
        input=args.input, json_keys=tuple(args.json_keys), tokenizer_type=args.tokenizer_type,
        output_prefix=args.output_prefix, tokenizer_model=args.tokenizer_model,
        vocab_size=args.vocab_size, append_eod=args.append_eod, workers=args.workers,
        log_interval=args.log_interval,
        include_special_tokens=not args.tokenizer_hf_no_include_special_tokens,
        partitions=args.partitions, keep_sequential_samples=args.keep_sequential_samples,
        vocab_file=args.vocab_file, merge_file=args.merge_file,
        model_file_options=_model_file_options(args))


def _model_file_options(args: argparse.Namespace) -> ModelFileOptions:
    special = args.tokenizer_special_tokens
    return ModelFileOptions(args.tiktoken_pattern, args.tiktoken_num_special_tokens,
                            tuple(special) if special is not None else None,
                            args.tokenizer_sentencepiece_ignore_extra_whitespaces)


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
        print(f"{summary.empty} text(s) had no tokens: written as empty documents (no "
              f"sequence), as Megatron-LM does")
    return 0


if __name__ == "__main__":
    sys.exit(main())
