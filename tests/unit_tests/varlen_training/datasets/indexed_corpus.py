"""Tiny Megatron indexed datasets for tests, written by megatron-core's IndexedDatasetBuilder.

``write_corpus(prefix, num_documents, seed)`` writes PREFIX.bin/.idx holding random byte-level
documents (ids 0..255, each ending in the ByteLevelTokenizer's eod) of very different lengths,
and returns the documents, so a test can count and compare tokens without reading them back
through the code under test.
"""

from __future__ import annotations

import numpy as np
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

from megatron.varlen_training.tokenizer import BYTE_EOD, NUM_BYTES

MIN_DOC_TOKENS, MAX_DOC_TOKENS = 2, 90


def random_documents(num_documents: int, seed: int,
                     id_range: tuple[int, int] = (0, NUM_BYTES),
                     tokens: tuple[int, int] = (MIN_DOC_TOKENS, MAX_DOC_TOKENS)
                     ) -> list[np.ndarray]:
    """Ids drawn from ``id_range`` then eod; lengths spread over ``tokens`` (both ends
    included) + 1. Disjoint ranges tell a sample's source dataset by its ids alone."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(tokens[0], tokens[1] + 1, size=num_documents)
    return [np.append(rng.integers(*id_range, size=int(n)), BYTE_EOD) for n in lengths]


def write_documents(prefix: str, documents: list[np.ndarray], dtype=np.uint16) -> str:
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for document in documents:
        builder.add_document(np.asarray(document, dtype=np.int64), [len(document)])
    builder.finalize(f"{prefix}.idx")
    return prefix


def write_corpus(prefix: str, num_documents: int, seed: int, dtype=np.uint16,
                 id_range: tuple[int, int] = (0, NUM_BYTES),
                 tokens: tuple[int, int] = (MIN_DOC_TOKENS, MAX_DOC_TOKENS)):
    """Writes PREFIX.bin/.idx; returns the documents written (numpy id arrays)."""
    documents = random_documents(num_documents, seed, id_range, tokens)
    write_documents(prefix, documents, dtype)
    return documents
