"""Tiny tokenizer model files made by the tests (no download): a SentencePiece model trained
from a few lines by the sentencepiece package itself, and a tiktoken vocabulary JSON written by
hand (the 256 single bytes, then a few merges). With the references the tests compare ids
against: the sentencepiece processor over the same file, and a ``tiktoken.Encoding`` built here
from the same ranks with Megatron-LM's layout (its special tokens first, ranks shifted by their
count), independently of the code under test.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

CORPUS = [
    "hello world, the cafe in a tea house",
    "the quick brown fox jumps over the lazy dog",
    "sentence piece models are trained from a few lines of text",
    "caf\u00e9 \u00fcber 12 123 -- tabs\tand  two spaces",
] * 8
SENTENCEPIECE_VOCAB = 64
TEXTS = [
    "",
    "hello world",
    "  leading spaces, trailing   ",
    "the cafe caf\u00e9 12 123\n\nnew lines",
    "unseen \u6f22\u5b57 \U0001F600 pieces",
    "</s> written in the text <s>",
    "HelloWorld camelCase",
]

# Merges after the 256 bytes, in rank order ("oW" tells the v1 pattern, which keeps
# "HelloWorld" one piece, from v2, which splits it before the capital).
TIKTOKEN_MERGES = [b"he", b"ll", b"hell", b"hello", b" w", b"or", b" wor", b"ld", b" world",
                   b"oW", b"12", b"\xc3\xa9", b"</", b"s>"]
NUM_BYTES = 256


def train_sentencepiece(folder: Path, name: str = "spm", **options) -> Path:
    """A BPE SentencePiece model of :data:`CORPUS` (``options``: the trainer's, e.g.
    ``pad_id=3`` for a model with a pad piece, ``eos_id=-1`` for one without an eos)."""
    import sentencepiece

    prefix = folder / name
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS), model_prefix=str(prefix), model_type="bpe",
        vocab_size=SENTENCEPIECE_VOCAB, minloglevel=2, **options)
    return Path(f"{prefix}.model")


def tiktoken_ranks() -> list[bytes]:
    """The vocabulary's tokens in rank order."""
    return [bytes([i]) for i in range(NUM_BYTES)] + TIKTOKEN_MERGES


def write_tiktoken_vocab(folder: Path, name: str = "tiktoken.vocab.json") -> Path:
    """The vocabulary JSON Megatron-LM's TikTokenizer reads: ``{rank, token_bytes, token_str}``
    per token, in rank order."""
    entries = [{"rank": rank, "token_bytes": base64.b64encode(token).decode("ascii"),
                "token_str": token.decode("utf-8", errors="replace")}
               for rank, token in enumerate(tiktoken_ranks())]
    path = folder / name
    path.write_text(json.dumps(entries), encoding="utf-8")
    return path


def tiktoken_reference(pattern: str, special_tokens: list[str], vocab_size: int):
    """``tiktoken.Encoding`` with Megatron-LM's layout: ids 0..len(special_tokens)-1 the special
    tokens (the caller's list, fillers included), then the ranks shifted, cut to
    ``vocab_size``; ``pattern`` is the regex itself."""
    import tiktoken

    shift = len(special_tokens)
    ranks = {token: rank + shift for rank, token in enumerate(tiktoken_ranks())
             if rank + shift < vocab_size}
    return tiktoken.Encoding(name="reference", pat_str=pattern, mergeable_ranks=ranks,
                             special_tokens={token: i for i, token in enumerate(special_tokens)})
