"""Megatron-LM's tokenizer-file flags (``--vocab-file``, ``--merge-file``; TikTokenizer's in
model_file_tokenizer_arguments.py) and its tokenizer flags this fork does not honour, for
pretrain_gpt.py, pretrain_mamba.py and tools/preprocess_data.py.

A flag that is not honoured is still registered, so that a Megatron-LM command line carrying it
gets one line naming the flag and what to do instead (exit 2), never a silent no-op. Each keeps
Megatron-LM's default as the value that changes nothing (e.g. ``--vocab-extra-ids 0``).
"""

from __future__ import annotations

import argparse

from megatron.varlen_training.megatron_lm_tokenizers import GPT2_BPE_TYPE, unavailable_reason
from megatron.varlen_training.model_file_tokenizers import TIKTOKEN_TYPE
from megatron.varlen_training.model_file_tokenizer_arguments import (
    add_model_file_tokenizer_args, validate_model_file_tokenizer_args,
)
from megatron.varlen_training.refused_flags import (
    SWITCH, FlagRow, add_flag_rows, dest_of, refuse_given,
)
from megatron.varlen_training.tokenizer import HF_TOKENIZER_TYPE, TOKENIZER_TYPE_FLAGS

_HF_DIR_HINT = ("save the tokenizer you want with transformers' save_pretrained and give it as "
                "--tokenizer-type HuggingFaceTokenizer --tokenizer-model DIR")
_NULL_IDS_WHY = ("NullTokenizer's eod and pad are --vocab-size - 1 here; preprocess and train "
                 "with that")
# What the types that ignore --tokenizer-model build their ids from.
_BUILT_FROM = {
    "NullTokenizer": "which reads the ids written in the text (--vocab-size of them)",
    "ByteLevelTokenizer": "which needs no file (UTF-8 bytes)",
    GPT2_BPE_TYPE: "which is built from --vocab-file and --merge-file",
}
REFUSED_FLAGS = (
    FlagRow(("--vocab-extra-ids",), {}, None,
            "the <extra_id_N> sentinels are for T5 span corruption, which this fork does not "
            "train", accepts=("0",)),
    FlagRow(("--tokenizer-metadata",), {}, None,
            "megatron-core's tokenizer metadata files are not read here; give the tokenizer by "
            "--tokenizer-type and its files"),
    FlagRow(("--special-tokens",), {"nargs": "+"}, None,
            f"special tokens are not added here; {_HF_DIR_HINT}"),
    FlagRow(("--tokenizer-sentencepiece-legacy",), SWITCH, False,
            "megatron-core's legacy SentencePiece wrapper (special tokens added by "
            "--tokenizer-special-tokens) is not built here; the SentencePiece types encode with "
            "the model alone, Megatron-LM's default: drop the flag"),
    FlagRow(("--tokenizer-hf-no-use-fast",), SWITCH, False,
            "Hugging Face tokenizers are always the fast (tokenizers) implementation here; drop "
            "the flag"),
    FlagRow(("--tokenizer-hf-no-include-special-tokens",), SWITCH, False,
            "training reads ids, not text: pass it to tools/preprocess_data.py, which turns the "
            "text into ids (SFT conversations render with the tokenizer's chat template)"),
    FlagRow(("--trust-remote-code",), SWITCH, False,
            f"tokenizer code from the model directory is never run here; {_HF_DIR_HINT}"),
    FlagRow(("--null-tokenizer-eod-id",), {}, None, _NULL_IDS_WHY),
    FlagRow(("--null-tokenizer-pad-id",), {}, None, _NULL_IDS_WHY, accepts=("-1",)),
    FlagRow(("--chat-template",), {}, None,
            "SFT renders conversations with the --tokenizer-model directory's own chat template "
            "(its tokenizer_config.json); put the template there"),
    FlagRow(("--use-gigatoken",), SWITCH, False,
            "the gigatoken tokenizer backend is not available here; drop the flag"),
    FlagRow(("--legacy-tokenizer",), SWITCH, False,
            "this fork builds each tokenizer one way, as Megatron-LM's default (megatron-core's "
            "tokenizer libraries; e.g. its legacy Llama2Tokenizer prepended a BOS, the default "
            "does not); drop the flag"),
)


def _refuse_unread_tokenizer_model(args: argparse.Namespace, require) -> None:
    """``--tokenizer-model`` is read by ``HuggingFaceTokenizer``, the SentencePiece types and
    TikTokenizer only; beside another type it would be ignored without a word (the run would
    train on that type's ids instead)."""
    kind = args.tokenizer_type
    if not args.tokenizer_model or "--tokenizer-model" in TOKENIZER_TYPE_FLAGS[kind]:
        return
    require(False,
            f"--tokenizer-model {args.tokenizer_model!r} is read by --tokenizer-type "
            f"{HF_TOKENIZER_TYPE}, the SentencePiece types and {TIKTOKEN_TYPE} only, but "
            f"--tokenizer-type is {kind}, {_BUILT_FROM[kind]}: "
            f"drop --tokenizer-model, or give --tokenizer-type {HF_TOKENIZER_TYPE} to train "
            f"with that tokenizer")


def add_tokenizer_file_args(parser, honoured: tuple[str, ...] = ()) -> None:
    """Registers ``--vocab-file``/``--merge-file`` and the refused Megatron-LM tokenizer flags
    (but those in ``honoured``, which the caller registers itself) on ``parser``."""
    group = parser.add_argument_group("tokenizer files (Megatron-LM's GPT2BPETokenizer)")
    group.add_argument("--vocab-file", default=None,
                       help=f"{GPT2_BPE_TYPE}: GPT-2's vocabulary JSON (e.g. gpt2-vocab.json); "
                            "its <|endoftext|> is the eod.")
    group.add_argument("--merge-file", default=None,
                       help=f"{GPT2_BPE_TYPE}: GPT-2's BPE merges (e.g. gpt2-merges.txt).")
    add_model_file_tokenizer_args(parser)
    add_flag_rows(parser.add_argument_group("Megatron-LM tokenizer flags refused here"),
                  REFUSED_FLAGS, skip=honoured)


def validate_tokenizer_args(args: argparse.Namespace, require,
                            honoured: tuple[str, ...] = ()) -> None:
    """The type can be built here, its files are given (and only for it), and no refused flag
    carries a value that would change something."""
    reason = unavailable_reason(args.tokenizer_type)
    require(reason is None, reason)
    _refuse_unread_tokenizer_model(args, require)
    validate_model_file_tokenizer_args(args, require)
    is_bpe = args.tokenizer_type == GPT2_BPE_TYPE
    for flag in ("--vocab-file", "--merge-file"):
        value = getattr(args, dest_of(flag, {}))
        require(value is not None or not is_bpe,
                f"--tokenizer-type {GPT2_BPE_TYPE} needs {flag} (GPT-2's vocabulary JSON and "
                "merges, e.g. --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt)")
        require(value is None or is_bpe,
                f"{flag} {value!r} is read by --tokenizer-type {GPT2_BPE_TYPE} only, but "
                f"--tokenizer-type is {args.tokenizer_type}: drop {flag} or change the type")
    refuse_given(args, REFUSED_FLAGS, require, skip=honoured)
