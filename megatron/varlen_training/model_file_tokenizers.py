"""Megatron-LM's tokenizer types read from one model file (``--tokenizer-model F``): the
SentencePiece types (SentencePieceTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer) and
TikTokenizer, built with megatron-core's own tokenizer libraries
(``megatron.core.tokenizers.text.libraries``), which is what Megatron-LM builds for them.

Megatron-LM (megatron-core's ``build_tokenizer``, its default since the legacy tokenizers became
opt-in with ``--legacy-tokenizer``) gives the three SentencePiece types one meaning: megatron-core's
``SentencePieceTokenizer`` over the ``.model`` file. Its values, kept here:

- text -> ids is the model's own ``encode`` (no BOS, no EOS: ``--append-eod`` adds the eod in
  preprocessing; Megatron-LM's legacy Llama2Tokenizer prepended a BOS, the default one does not);
- the vocabulary is the model's pieces, eod its eos id, pad its pad id (the eod where the model
  has none, as for Hugging Face tokenizers here: Megatron-LM's -1 is no id to pad with).

TikTokenizer is megatron-core's ``TikTokenTokenizer`` over a tiktoken vocabulary JSON (a list of
``{"rank", "token_bytes", "token_str"}``, the first 256 the single bytes), never a named
encoding (``tiktoken.get_encoding`` would download one): ids 0..N-1 are the special tokens
(``--tokenizer-special-tokens``, which must hold megatron-core's seven, then ``<SPECIAL_i>``
fillers up to ``--tiktoken-num-special-tokens`` N), the file's ranks follow shifted by N, cut to
``--vocab-size`` (default 2^17) in all; eod is ``</s>``, pad ``<pad>``; the text is split by
``--tiktoken-pattern`` v1 or v2 (default v2) and special tokens written in it are their ids.

This module imports megatron-core and the packages only when a tokenizer is built: the flag
layer reads its names and defaults at parse time.
"""

from __future__ import annotations

import base64
import binascii
import importlib.util
import json
import os
from dataclasses import dataclass

SENTENCEPIECE_TYPES = ("SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer")
TIKTOKEN_TYPE = "TikTokenizer"
MODEL_FILE_TYPES = (*SENTENCEPIECE_TYPES, TIKTOKEN_TYPE)
PACKAGE_OF = {**dict.fromkeys(SENTENCEPIECE_TYPES, "sentencepiece"), TIKTOKEN_TYPE: "tiktoken"}
PIP_EXTRA = "tokenizers"  # pyproject.toml's extra that installs both packages

# megatron-core's TikTokenTokenizer defaults, which Megatron-LM keeps when its flags are unset.
TIKTOKEN_PATTERNS = ("v1", "v2")
TIKTOKEN_DEFAULT_PATTERN = "v2"
TIKTOKEN_DEFAULT_VOCAB_SIZE = 2**17
TIKTOKEN_DEFAULT_NUM_SPECIAL_TOKENS = 1000
# The special tokens megatron-core's TikToken tokenizer needs (unk, bos, eos/eod, mask, pad, cls,
# sep); its default list, in its order: their ids are their positions.
TIKTOKEN_SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<mask>", "<pad>", "<cls>", "<sep>")
TIKTOKEN_RANK_KEYS = {"rank", "token_bytes", "token_str"}
NUM_BYTES = 256  # a tiktoken vocabulary starts with the 256 single bytes, rank = byte
NO_ID = -1  # what sentencepiece returns for a special piece the model does not have


@dataclass(frozen=True)
class ModelFileOptions:
    """The flags of these types besides ``--tokenizer-model``: TikTokenizer's
    ``--tiktoken-pattern`` (None: megatron-core's v2), ``--tiktoken-num-special-tokens`` and
    ``--tokenizer-special-tokens`` (None: megatron-core's seven); its vocabulary is
    ``--vocab-size`` (build_tokenizer's ``vocab_size``). The SentencePiece types'
    ``ignore_extra_whitespaces`` (False: ``--no-tokenizer-sentencepiece-ignore-extra-whitespaces``,
    runs of spaces kept by megatron-core's placeholder pieces where the model collapses them)."""

    pattern: str | None = None
    num_special_tokens: int = TIKTOKEN_DEFAULT_NUM_SPECIAL_TOKENS
    special_tokens: tuple[str, ...] | None = None
    ignore_extra_whitespaces: bool = True

    @classmethod
    def of(cls, data) -> ModelFileOptions:
        """The options a run's DataConfig (config/data.py) carries."""
        special = data.tokenizer_special_tokens
        return cls(data.tiktoken_pattern, data.tiktoken_num_special_tokens,
                   tuple(special) if special is not None else None,
                   data.tokenizer_sentencepiece_ignore_extra_whitespaces)


def missing_package(tokenizer_type: str) -> str | None:
    """One line naming the package ``tokenizer_type`` needs and how to install it, or None when
    it needs none or the package is installed."""
    package = PACKAGE_OF.get(tokenizer_type)
    if package is None or importlib.util.find_spec(package) is not None:
        return None
    return (f"--tokenizer-type {tokenizer_type} needs the {package} package, which is not "
            f"installed: pip install {package} (or this package's [{PIP_EXTRA}] extra)")


def tiktoken_options_problem(options: ModelFileOptions, vocab_size: int | None) -> str | None:
    """Why megatron-core would refuse these TikTokenizer values (its asserts), in one line
    naming the flags, or None."""
    tokens = list(options.special_tokens or TIKTOKEN_SPECIAL_TOKENS)
    vocab = vocab_size or TIKTOKEN_DEFAULT_VOCAB_SIZE
    count = options.num_special_tokens
    shown = " ".join(tokens)
    if len(set(tokens)) != len(tokens):
        return f"--tokenizer-special-tokens {shown}: a token is given twice"
    missing = [token for token in TIKTOKEN_SPECIAL_TOKENS if token not in tokens]
    if missing:
        return (f"--tokenizer-special-tokens {shown} lacks {' '.join(missing)}: TikTokenizer "
                f"needs {' '.join(TIKTOKEN_SPECIAL_TOKENS)} among them")
    if not len(tokens) <= count < vocab:
        return (f"--tiktoken-num-special-tokens {count} must be at least the {len(tokens)} "
                f"special tokens and below the vocabulary, --vocab-size {vocab}")
    return None


def _require_file(tokenizer_type: str, path: str | None, what: str) -> str:
    if path is None or not os.path.isfile(path):
        raise ValueError(f"--tokenizer-type {tokenizer_type}: --tokenizer-model {path!r} is "
                         f"not a file ({what})")
    return path


def _require_package(tokenizer_type: str) -> None:
    problem = missing_package(tokenizer_type)
    if problem is not None:
        raise ValueError(problem)


def sentencepiece_library(tokenizer_type: str, model_file: str | None,
                          ignore_extra_whitespaces: bool = True):
    """megatron-core's SentencePiece tokenizer over ``model_file``, as Megatron-LM builds it for
    each of the three SentencePiece types."""
    _require_package(tokenizer_type)
    _require_file(tokenizer_type, model_file, "a SentencePiece model, e.g. tokenizer.model")
    from megatron.core.tokenizers.text.libraries.sentencepiece_tokenizer import (
        SentencePieceTokenizer,
    )

    try:
        library = SentencePieceTokenizer(model_file,
                                         ignore_extra_whitespaces=ignore_extra_whitespaces)
    except (RuntimeError, OSError) as err:  # sentencepiece's error for a file it cannot parse
        raise ValueError(f"--tokenizer-model {model_file!r} is not a SentencePiece model: "
                         f"{str(err).splitlines()[0]}") from None
    if library.eos_id == NO_ID:
        raise ValueError(f"--tokenizer-model {model_file!r} has no end-of-sentence piece, "
                         f"which --tokenizer-type {tokenizer_type} ends documents with (eod): "
                         "train the model with one (sentencepiece's eos_id)")
    return library


def check_tiktoken_vocabulary(path: str, needed: int) -> None:
    """The vocabulary JSON megatron-core reads, checked so that a bad file is one line (the
    library only asserts): a list of ``needed`` or more ranks, rank = position, bytes first."""
    if not path.endswith(".json"):
        raise ValueError(f"--tokenizer-model {path!r}: TikTokenizer reads a tiktoken vocabulary "
                         "JSON (a .json file of ranks)")
    try:
        with open(path, encoding="utf-8") as file:
            ranks = json.load(file)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"--tokenizer-model {path!r} is not a readable JSON file: "
                         f"{err}") from None
    if not isinstance(ranks, list):
        raise ValueError(f"--tokenizer-model {path!r} is not a JSON list of ranks")
    for position, entry in enumerate(ranks):
        if not isinstance(entry, dict) or set(entry) != TIKTOKEN_RANK_KEYS \
                or entry["rank"] != position:
            raise ValueError(f"--tokenizer-model {path!r}: entry {position} is not "
                             f'{{"rank": {position}, "token_bytes": ..., "token_str": ...}}')
        try:
            token = base64.b64decode(entry["token_bytes"], validate=True)
        except (binascii.Error, TypeError):
            raise ValueError(f"--tokenizer-model {path!r}: entry {position}'s token_bytes is "
                             "not base64") from None
        if position < NUM_BYTES and token != bytes([position]):
            raise ValueError(f"--tokenizer-model {path!r}: entry {position} is not the byte "
                             f"{position} (the first {NUM_BYTES} ranks are the single bytes)")
    if len(ranks) < needed:
        raise ValueError(f"--tokenizer-model {path!r} has {len(ranks)} ranks but the vocabulary "
                         f"needs {needed} (--vocab-size minus --tiktoken-num-special-tokens): "
                         "lower --vocab-size")


def tiktoken_library(model_file: str | None, vocab_size: int | None, options: ModelFileOptions):
    """megatron-core's TikToken tokenizer over the vocabulary JSON ``model_file``, with
    Megatron-LM's flag values (never a named tiktoken encoding: nothing is downloaded)."""
    _require_package(TIKTOKEN_TYPE)
    _require_file(TIKTOKEN_TYPE, model_file, "a tiktoken vocabulary JSON")
    problem = tiktoken_options_problem(options, vocab_size)
    if problem is not None:
        raise ValueError(problem)
    vocab = vocab_size or TIKTOKEN_DEFAULT_VOCAB_SIZE
    check_tiktoken_vocabulary(model_file, vocab - options.num_special_tokens)
    from megatron.core.tokenizers.text.libraries.tiktoken_tokenizer import TikTokenTokenizer

    special = list(options.special_tokens) if options.special_tokens else None
    return TikTokenTokenizer(model_file, special_tokens=special,
                             num_special_tokens=options.num_special_tokens,
                             pattern=options.pattern or TIKTOKEN_DEFAULT_PATTERN, vocab_size=vocab)
