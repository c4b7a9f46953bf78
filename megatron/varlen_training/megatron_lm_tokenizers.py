"""Megatron-LM's classic ``--tokenizer-type`` values: GPT2BPETokenizer, built from its vocabulary
and merges files, and one-line refusals for the types this fork does not build.

``--tokenizer-type GPT2BPETokenizer --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt``
is Megatron-LM's GPT recipe. Its tokenizer is GPT-2's byte-level BPE: the ``tokenizers``
library's BPE model over ``--vocab-file`` (JSON token -> id) and ``--merge-file`` (one merge
``A B`` a line, ranked by position), GPT-2's byte-level pre-tokenizer without a prefix space,
and ``<|endoftext|>`` as the one special token. It is what megatron-core's library resolves the
type to (a ``transformers`` GPT-2 tokenizer over the same two files); it is built here from the
files directly because megatron-core's ``MegatronHFTokenizer`` asks the Hugging Face hub for
``gpt2`` first, which an offline cluster cannot reach. Megatron-LM's values follow:

- ``eod`` is the id of ``<|endoftext|>`` in the vocabulary file (50256 for GPT-2's);
- the vocabulary is the file's entries (50257 for GPT-2's), padded by the model to a multiple of
  ``--make-vocab-size-divisible-by`` x TP (50304 for GPT-2's with 128 and TP 1);
- text becomes ids without a BOS or an eod (``--append-eod`` adds the eod in preprocessing);
  ``<|endoftext|>`` written in the text is the eod id, as in megatron-core's library.

The SentencePiece types and TikTokenizer are built in model_file_tokenizers.py when their
package is installed (sentencepiece, tiktoken: the ``[tokenizers]`` extra). The others train
models this fork does not (BERT, multimodal); :func:`unavailable_reason` says so in one line,
naming what to use instead, or names the package to install.
"""

from __future__ import annotations

import json
import os
import shutil

from megatron.varlen_training.model_file_tokenizers import (
    MODEL_FILE_TYPES, missing_package,
)

GPT2_BPE_TYPE = "GPT2BPETokenizer"
GPT2_EOD_TOKEN = "<|endoftext|>"  # GPT-2's end of text: Megatron-LM's eod
MERGES_HEADER = "#version"  # the first line of GPT-2's merges file, not a merge

_HF_HINT = ("convert the model's tokenizer to a Hugging Face tokenizer directory and give it as "
            "--tokenizer-type HuggingFaceTokenizer --tokenizer-model DIR")
# type -> why it is not built here and what to use instead
_REFUSED_TYPES = {
    "BertWordPieceLowerCase": "BERT's WordPiece vocabulary is for BERT/T5 models, which this "
                              "fork does not train; for a GPT or Mamba model, " + _HF_HINT,
    "BertWordPieceCase": "BERT's WordPiece vocabulary is for BERT/T5 models, which this fork "
                         "does not train; for a GPT or Mamba model, " + _HF_HINT,
    "MultimodalTokenizer": "this fork trains text models only; " + _HF_HINT,
    "NullMultimodalTokenizer": "this fork trains text models only; use --tokenizer-type "
                               "NullTokenizer --vocab-size N",
    "SFTTokenizer": "SFT here renders conversations with the tokenizer's own chat template: "
                    "use --sft --tokenizer-type HuggingFaceTokenizer --tokenizer-model DIR",
}
MEGATRON_LM_ONLY_TYPES = (GPT2_BPE_TYPE, *MODEL_FILE_TYPES, *_REFUSED_TYPES)


def unavailable_reason(tokenizer_type: str) -> str | None:
    """One line saying why ``--tokenizer-type tokenizer_type`` cannot be built here (the missing
    package and ``pip install`` where one is missing), or None when it can."""
    flag = f"--tokenizer-type {tokenizer_type}"
    if tokenizer_type in _REFUSED_TYPES:
        return f"{flag} is not supported: {_REFUSED_TYPES[tokenizer_type]}"
    return missing_package(tokenizer_type)


def read_vocab_file(path: str | None) -> dict[str, int]:
    """``--vocab-file``: GPT-2's JSON object of token -> id, with ``<|endoftext|>`` in it."""
    if path is None:
        raise ValueError(f"--tokenizer-type {GPT2_BPE_TYPE} needs --vocab-file (GPT-2's "
                         "vocabulary JSON, e.g. gpt2-vocab.json) and --merge-file")
    try:
        with open(path, encoding="utf-8") as file:
            vocab = json.load(file)
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"--vocab-file {path!r} is not a readable vocabulary JSON: "
                         f"{err}") from None
    if not isinstance(vocab, dict) or not all(isinstance(i, int) for i in vocab.values()):
        raise ValueError(f"--vocab-file {path!r} is not a JSON object of token -> id (GPT-2's "
                         "vocab.json)")
    if GPT2_EOD_TOKEN not in vocab:
        raise ValueError(f"--vocab-file {path!r} has no {GPT2_EOD_TOKEN!r} entry, the eod of "
                         f"--tokenizer-type {GPT2_BPE_TYPE}")
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise ValueError(f"--vocab-file {path!r}: the ids of its {len(vocab)} tokens are not "
                         f"0..{len(vocab) - 1}, each once")
    return vocab


def read_merge_file(path: str | None) -> list[tuple[str, str]]:
    """``--merge-file``: one merge ``A B`` a line, after GPT-2's ``#version`` header."""
    if path is None:
        raise ValueError(f"--tokenizer-type {GPT2_BPE_TYPE} needs --merge-file (GPT-2's merges, "
                         "e.g. gpt2-merges.txt) beside --vocab-file")
    try:
        with open(path, encoding="utf-8") as file:
            lines = file.read().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"--merge-file {path!r} is not a readable merges file: {err}") from None
    merges = []
    for number, line in enumerate(lines, start=1):
        if not line or (number == 1 and line.startswith(MERGES_HEADER)):
            continue
        parts = line.split(" ")
        if len(parts) != 2:
            raise ValueError(f"--merge-file {path!r} line {number} {line!r} is not a merge "
                             "'A B' (two tokens and one space)")
        merges.append((parts[0], parts[1]))
    return merges


def gpt2_bpe_backend(vocab_file: str | None, merge_file: str | None):
    """GPT-2's byte-level BPE over the two files, as a ``transformers`` tokenizer object (what
    :class:`megatron.varlen_training.tokenizer.HuggingFaceTokenizer` adapts)."""
    vocab, merges = read_vocab_file(vocab_file), read_merge_file(merge_file)
    try:  # optional: only this tokenizer and HuggingFaceTokenizer need them
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast
    except ImportError as err:
        raise ValueError(f"--tokenizer-type {GPT2_BPE_TYPE} needs the tokenizers and "
                         f"transformers packages: pip install transformers ({err})") from None
    missing = sorted({token for pair in merges for token in pair} - set(vocab))
    if missing:
        raise ValueError(f"--merge-file {merge_file!r} merges {missing[0]!r}, which --vocab-file "
                         f"{vocab_file!r} does not have: the two files are not one tokenizer's")
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=GPT2_EOD_TOKEN,
                                   bos_token=GPT2_EOD_TOKEN, unk_token=GPT2_EOD_TOKEN)


GPT2_HF_FILES = ("vocab.json", "merges.txt")  # GPT-2's own file names in a HF directory
HF_TOKENIZER_CONFIG = "tokenizer_config.json"
HF_GPT2_CLASS = "GPT2Tokenizer"  # what transformers loads the directory with (as the hub's gpt2)


def gpt2_eod_id(vocab_file: str | None) -> int:
    """The eod id of ``--vocab-file`` (the id of ``<|endoftext|>``)."""
    return read_vocab_file(vocab_file)[GPT2_EOD_TOKEN]


def save_gpt2_bpe(vocab_file: str | None, merge_file: str | None, out_dir: str) -> None:
    """Writes the tokenizer as a Hugging Face GPT-2 tokenizer directory: ``tokenizer.json``,
    ``tokenizer_config.json`` naming GPT-2's class, and the two files under GPT-2's names, so
    that ``AutoTokenizer.from_pretrained(out_dir)`` gives the ids training read."""
    gpt2_bpe_backend(vocab_file, merge_file).save_pretrained(out_dir)
    for source, name in zip((vocab_file, merge_file), GPT2_HF_FILES):
        shutil.copyfile(source, os.path.join(out_dir, name))
    config_path = os.path.join(out_dir, HF_TOKENIZER_CONFIG)
    with open(config_path, encoding="utf-8") as file:
        config = json.load(file)
    config["tokenizer_class"] = HF_GPT2_CLASS  # not the generic fast class: what GPT-2 has
    with open(config_path, "w", encoding="utf-8") as file:
        json.dump(config, file, indent=2)
