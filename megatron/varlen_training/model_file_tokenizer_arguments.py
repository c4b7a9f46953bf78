"""Flags of Megatron-LM's tokenizer types read from one model file (model_file_tokenizers.py:
the SentencePiece types and TikTokenizer), for pretrain_gpt.py, pretrain_mamba.py and
tools/preprocess_data.py: Megatron-LM's names, defaults and meaning.

- ``--tokenizer-model F`` is required by these types (the flag itself is the entry points').
- ``--no-tokenizer-sentencepiece-ignore-extra-whitespaces`` (or ``--disable-...``, Megatron-LM's
  two names) keeps runs of spaces that a SentencePiece model collapses (megatron-core's
  placeholder pieces); refused beside another type.
- ``--tiktoken-pattern`` (v1/v2, unset: megatron-core's v2), ``--tiktoken-num-special-tokens``
  (1000) and ``--tokenizer-special-tokens`` configure TikTokenizer; ``--tiktoken-special-tokens``
  is Megatron-LM's older name of ``--tokenizer-special-tokens``, taken when that is unset.
  Beside another type they would change nothing in Megatron-LM without a word: refused here.

Imports neither megatron-core nor the tokenizer packages (the flag layer parses without them).
"""

from __future__ import annotations

import argparse

from megatron.varlen_training.model_file_tokenizers import (
    MODEL_FILE_TYPES, SENTENCEPIECE_TYPES, TIKTOKEN_DEFAULT_NUM_SPECIAL_TOKENS, TIKTOKEN_PATTERNS,
    TIKTOKEN_SPECIAL_TOKENS, TIKTOKEN_TYPE, ModelFileOptions, tiktoken_options_problem,
)

_WHAT_MODEL = {**dict.fromkeys(SENTENCEPIECE_TYPES, "the SentencePiece model, e.g. "
                                                    "tokenizer.model"),
               TIKTOKEN_TYPE: "the tiktoken vocabulary JSON, e.g. tokenizer.json"}
_OLD_SPECIAL_TOKENS_FLAG = "--tiktoken-special-tokens"
_KEEP_WHITESPACE_FLAGS = ("--no-tokenizer-sentencepiece-ignore-extra-whitespaces",
                          "--disable-tokenizer-sentencepiece-ignore-extra-whitespaces")
_HF_DIR_HINT = ("save the tokenizer you want with transformers' save_pretrained and give it as "
                "--tokenizer-type HuggingFaceTokenizer --tokenizer-model DIR")


def add_model_file_tokenizer_args(parser) -> None:
    """Registers TikTokenizer's flags on ``parser`` (Megatron-LM's names and defaults)."""
    group = parser.add_argument_group("TikTokenizer (Megatron-LM's)")
    group.add_argument("--tiktoken-pattern", choices=TIKTOKEN_PATTERNS, default=None,
                       help="TikTokenizer: the pre-tokenizer regex, v1 or v2 (unset: "
                            "megatron-core's v2).")
    group.add_argument("--tiktoken-num-special-tokens", type=int,
                       default=TIKTOKEN_DEFAULT_NUM_SPECIAL_TOKENS,
                       help="TikTokenizer: ids 0..N-1 are special tokens (the given ones, then "
                            "<SPECIAL_i> fillers); the vocabulary file's ranks follow.")
    group.add_argument("--tokenizer-special-tokens", nargs="+", default=None,
                       help="TikTokenizer: the special tokens, in id order; they must include "
                            f"{' '.join(TIKTOKEN_SPECIAL_TOKENS)} (unset: those seven).")
    group.add_argument(_OLD_SPECIAL_TOKENS_FLAG, nargs="+", default=None,
                       help="Megatron-LM's older name of --tokenizer-special-tokens (used when "
                            "that is unset).")
    group = parser.add_argument_group("SentencePiece types (Megatron-LM's)")
    group.add_argument(*_KEEP_WHITESPACE_FLAGS, action="store_false",
                       dest="tokenizer_sentencepiece_ignore_extra_whitespaces",
                       help="SentencePiece types: keep runs of spaces the model collapses "
                            "(megatron-core's placeholder pieces between them); by default the "
                            "model's own encoding.")


def _take_old_special_tokens(args: argparse.Namespace, require) -> None:
    """Megatron-LM's ``--tiktoken-special-tokens``: its value when ``--tokenizer-special-tokens``
    is unset; both given with different tokens would leave one unread."""
    old, new = args.tiktoken_special_tokens, args.tokenizer_special_tokens
    if old is None:
        return
    require(new is None or new == old,
            f"{_OLD_SPECIAL_TOKENS_FLAG} {' '.join(old)} and --tokenizer-special-tokens "
            f"{' '.join(new or [])} differ: give --tokenizer-special-tokens only")
    args.tokenizer_special_tokens = list(old)


def _given_tiktoken_flags(args: argparse.Namespace) -> list[str]:
    """TikTokenizer's flags given a value that asks for something, as ``--flag VALUE``."""
    given = []
    if args.tiktoken_pattern is not None:
        given.append(f"--tiktoken-pattern {args.tiktoken_pattern}")
    if args.tiktoken_num_special_tokens != TIKTOKEN_DEFAULT_NUM_SPECIAL_TOKENS:
        given.append(f"--tiktoken-num-special-tokens {args.tiktoken_num_special_tokens}")
    return given


def validate_model_file_tokenizer_args(args: argparse.Namespace, require) -> None:
    """These types have their ``--tokenizer-model``; TikTokenizer's values are ones megatron-core
    accepts; TikTokenizer's flags are not given beside another type."""
    kind = args.tokenizer_type
    if kind in MODEL_FILE_TYPES:
        require(args.tokenizer_model is not None,
                f"--tokenizer-type {kind} needs --tokenizer-model ({_WHAT_MODEL[kind]})")
    _take_old_special_tokens(args, require)
    require(args.tokenizer_sentencepiece_ignore_extra_whitespaces or kind in SENTENCEPIECE_TYPES,
            f"{_KEEP_WHITESPACE_FLAGS[0]} configures the SentencePiece types, but "
            f"--tokenizer-type is {kind}: drop the flag or change the type")
    special = args.tokenizer_special_tokens
    if kind == TIKTOKEN_TYPE:
        options = ModelFileOptions(args.tiktoken_pattern, args.tiktoken_num_special_tokens,
                                   tuple(special) if special is not None else None)
        problem = tiktoken_options_problem(options, args.vocab_size)
        require(problem is None, problem)
        return
    for given in _given_tiktoken_flags(args):
        require(False, f"{given} configures --tokenizer-type {TIKTOKEN_TYPE}, but "
                       f"--tokenizer-type is {kind}: drop the flag or change the type")
    require(special is None,
            f"--tokenizer-special-tokens {' '.join(special or [])}: special tokens are added "
            f"for --tokenizer-type {TIKTOKEN_TYPE} only (Megatron-LM's SentencePiece types "
            f"take none without its legacy wrapper); for --tokenizer-type {kind}, {_HF_DIR_HINT}")
