"""A tiny GPT-2 vocabulary/merges pair written by the tests (no download), and an independent
GPT-2 byte-level BPE written from the published algorithm, to check ids against.

The vocabulary is GPT-2's layout in small: the 256 byte symbols, one entry per merge (in merge
order), then ``<|endoftext|>`` last, so eod = vocabulary size - 1 (NullTokenizer's eod for the
same size: the same .bin trains identically under both).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import regex

EOD_TOKEN = "<|endoftext|>"
# GPT-2's pre-tokenization pattern (openai/gpt-2 encoder.py).
GPT2_PATTERN = regex.compile(
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
# Merges in rank order; later ones build on earlier ones, and "e l" ranks below "l l" so the
# order matters for "hello".
MERGES = [
    ("h", "e"), ("l", "l"), ("e", "l"), ("he", "ll"), ("hell", "o"), ("Ġ", "t"), ("Ġt", "he"),
    ("Ġ", "w"), ("Ġw", "o"), ("r", "l"), ("Ġwo", "rl"), ("Ġworl", "d"), ("i", "n"),
    ("Ġ", "a"), ("Ã", "©"), ("c", "a"), ("ca", "f"), ("Ġ", "Ġ"), ("Ċ", "Ċ"), ("1", "2"),
]


def byte_symbols() -> list[str]:
    """GPT-2's printable stand-in for each byte 0..255 (bytes_to_unicode), in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
                 *range(ord("\u00ae"), ord("\u00ff") + 1)]
    symbols, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            symbols[byte] = chr(byte)
        else:
            symbols[byte] = chr(256 + extra)
            extra += 1
    return [symbols[byte] for byte in range(256)]


def vocabulary() -> dict[str, int]:
    tokens = byte_symbols() + [a + b for a, b in MERGES] + [EOD_TOKEN]
    return {token: i for i, token in enumerate(tokens)}


def write_gpt2_files(folder: Path) -> tuple[Path, Path]:
    """Writes ``gpt2-vocab.json`` and ``gpt2-merges.txt`` (Megatron-LM's file names)."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab_file, merge_file = folder / "gpt2-vocab.json", folder / "gpt2-merges.txt"
    vocab_file.write_text(json.dumps(vocabulary()), encoding="utf-8")
    merge_file.write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in MERGES),
                          encoding="utf-8")
    return vocab_file, merge_file


def _bpe(word: str, ranks: dict[tuple[str, str], int]) -> list[str]:
    """Merges the best-ranked adjacent pair, everywhere in the word, until none is ranked."""
    parts = list(word)
    while len(parts) > 1:
        rank, best = min((ranks.get(pair, math.inf), pair) for pair in zip(parts, parts[1:]))
        if rank == math.inf:
            break
        merged, i = [], 0
        while i < len(parts):
            if i + 1 < len(parts) and (parts[i], parts[i + 1]) == best:
                merged.append(parts[i] + parts[i + 1])
                i += 2
            else:
                merged.append(parts[i])
                i += 1
        parts = merged
    return parts


def reference_ids(text: str) -> list[int]:
    """GPT-2's encoding of ``text`` over :func:`vocabulary`, ``<|endoftext|>`` as its id."""
    vocab, symbols = vocabulary(), byte_symbols()
    ranks = {pair: rank for rank, pair in enumerate(MERGES)}
    ids: list[int] = []
    for position, chunk in enumerate(text.split(EOD_TOKEN)):
        if position:
            ids.append(vocab[EOD_TOKEN])
        for word in GPT2_PATTERN.findall(chunk):
            mapped = "".join(symbols[byte] for byte in word.encode("utf-8"))
            ids.extend(vocab[token] for token in _bpe(mapped, ranks))
    return ids
