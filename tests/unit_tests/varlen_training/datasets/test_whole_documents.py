"""Whole-document packing (--packing-unit document): every token of every document trains
exactly once per epoch, proven by counting; long documents are cut only at the layout's limit."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from megatron.varlen.scheduling import padded_length
from megatron.varlen_training.datasets.whole_documents import (
    WholeDocumentDataset, longest_sequence, piece_table,
)
from megatron.varlen_training.varlen_arguments import sequence_cp_sizes

EOD, PAD = 99, 98


def _corpus(seed: int, num_docs: int, longest: int) -> list[np.ndarray]:
    """Documents of very different lengths (1 id up to ``longest``), ids tagged so every
    (document, position) is recognisable: id = 1000 * document + position."""
    rng = np.random.default_rng(seed)
    lengths = np.concatenate([[1, 2, longest], rng.integers(1, longest, num_docs - 3)])
    return [1000 * d + np.arange(n) for d, n in enumerate(lengths)]


@pytest.mark.parametrize("max_length", [1, 7, 64, 1000])
def test_every_token_of_every_document_trains_once_per_epoch(max_length):
    docs = _corpus(seed=max_length, num_docs=40, longest=150)
    doc_ids = np.arange(len(docs))
    num_ids = np.array([len(d) for d in docs])
    probe = WholeDocumentDataset(docs.__getitem__, num_ids, doc_ids, 1, max_length, 5, PAD)
    epoch = probe.pieces_per_epoch
    dataset = WholeDocumentDataset(docs.__getitem__, num_ids, doc_ids, 2 * epoch, max_length,
                                   5, PAD)
    for first in (0, epoch):  # two epochs, each complete on its own
        inputs, labels = Counter(), Counter()
        for idx in range(first, first + epoch):
            sample = dataset[idx]
            n = sample["length"]
            assert 1 <= n <= max_length
            inputs.update(sample["tokens"][:n].tolist())
            labels.update(ids for ids, m in zip(sample["labels"][:n].tolist(),
                                                sample["loss_mask"][:n].tolist()) if m)
        # Counted against the corpus itself: every id but each document's last is an input,
        # every id but each document's first is a trained label, each exactly once.
        expected_inputs = Counter(int(t) for d in docs for t in d[:-1])
        expected_labels = Counter(int(t) for d in docs for t in d[1:])
        assert inputs == expected_inputs
        assert labels == expected_labels
    # The order changes between epochs (seeded), the content does not.
    first_order = [dataset.piece(i) for i in range(epoch)]
    second_order = [dataset.piece(i) for i in range(epoch, 2 * epoch)]
    assert sorted(first_order) == sorted(second_order)
    assert first_order != second_order or epoch < 3


def test_documents_are_cut_only_beyond_the_limit():
    document, offset, length = piece_table(np.array([1, 2, 11, 12, 25]), max_length=10)
    assert document.tolist() == [1, 2, 3, 3, 4, 4, 4]
    assert offset.tolist() == [0, 0, 0, 10, 0, 10, 20]
    assert length.tolist() == [1, 10, 10, 1, 10, 10, 4]


def test_same_stream_on_every_read_order():
    docs = _corpus(seed=1, num_docs=10, longest=30)
    num_ids = np.array([len(d) for d in docs])
    a = WholeDocumentDataset(docs.__getitem__, num_ids, np.arange(10), 25, 8, 3, PAD)
    b = WholeDocumentDataset(docs.__getitem__, num_ids, np.arange(10), 25, 8, 3, PAD)
    backwards = {i: b[i]["tokens"].tolist() for i in reversed(range(25))}
    assert all(a[i]["tokens"].tolist() == backwards[i] for i in range(25))


@pytest.mark.parametrize("stream", [0, 1, 2])
def test_epoch_order_is_the_seeded_permutation_of_the_pieces(stream):
    """Stream 0 (a run with one dataset, the first of a blend) permutes epoch e with
    numpy's generator seeded (seed, e), the order checkpoints of such runs were trained on;
    stream k > 0 adds k to the seed material: an order of its own."""
    docs = _corpus(seed=2, num_docs=12, longest=20)
    num_ids = np.array([len(d) for d in docs])
    pieces = list(zip(*(column.tolist() for column in piece_table(num_ids, 6))))
    dataset = WholeDocumentDataset(docs.__getitem__, num_ids, np.arange(12), 3 * len(pieces), 6,
                                   11, PAD, stream=stream)
    for epoch in range(3):
        material = [11, epoch] + ([stream] if stream else [])
        order = np.random.default_rng(material).permutation(len(pieces))
        reads = [dataset.piece(epoch * len(pieces) + k) for k in range(len(pieces))]
        assert reads == [pieces[k] for k in order]
    if stream:
        alone = WholeDocumentDataset(docs.__getitem__, num_ids, np.arange(12), len(pieces), 6, 11,
                                     PAD)
        assert [alone.piece(k) for k in range(len(pieces))] != \
            [dataset.piece(k) for k in range(len(pieces))]


@pytest.mark.parametrize("budget,cp_sizes,sp", [(16, [1], 1), (16, [1, 2, 4], 1),
                                                 (10, [3], 2), (7, [1, 2], 2)])
def test_longest_sequence_fits_its_largest_group(budget, cp_sizes, sp):
    longest = longest_sequence(budget, cp_sizes, sp)
    fits = lambda n: any(padded_length(n, c, sp) // c <= budget for c in cp_sizes)  # noqa: E731
    assert fits(longest) and not fits(longest + 1)
    assert longest_sequence(budget, cp_sizes, sp, max_positions=5) == min(longest, 5)


def test_sequence_cp_sizes_static_and_dynamic():
    """The CP sizes the longest piece is derived from, by hand: static CP runs every sequence
    on its one size; dynamic CP on the chain from the minimum up (min 3 -> the next size, 4)."""
    assert sequence_cp_sizes(8, cp_size=2, min_cp_size=1, dynamic=False) == [2]
    assert sequence_cp_sizes(8, cp_size=1, min_cp_size=1, dynamic=True) == [1, 2, 4, 8]
    assert sequence_cp_sizes(8, cp_size=1, min_cp_size=3, dynamic=True) == [4, 8]
    assert sequence_cp_sizes(12, cp_size=3, min_cp_size=1, dynamic=True) == [1, 3, 6, 12]
