"""Blends with --packing-unit document: the weights are shares of training TOKENS.

References, all outside the code under test: the documents as written (their pieces cut by hand
here), megatron-core's own blending function fed weights computed here from the documents'
lengths, and a WholeDocumentDataset built directly, as a run on one dataset builds it.
Every dataset's ids lie in a range of their own, so a sample's source is read off its ids.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from megatron.core.datasets import helpers_cpp
from megatron.core.datasets.indexed_dataset import IndexedDataset

from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.datasets.builder import build_datasets
from megatron.varlen_training.datasets.whole_documents import WholeDocumentDataset
from megatron.varlen_training.flag_errors import ArgumentValidationError
from megatron.varlen_training.tokenizer import BYTE_EOD, BYTE_PAD, ByteLevelTokenizer
from tests.unit_tests.varlen_training.datasets.indexed_corpus import (
    write_corpus, write_documents,
)

BUDGET = 24  # the longest piece: one rank, no CP, --seq-length (the position table) as long
SEED = 7
TRAIN_SHARE = 0.9  # --split 90,10,0
# name: (documents, their id range, their training tokens): short, long (cut) and middling
# documents, so the datasets' mean piece lengths differ (about 6, 20 and 15 tokens).
CORPORA = {"short": (50, (0, 80), (2, 10)), "long": (20, (80, 160), (30, 90)),
           "mid": (30, (160, BYTE_EOD), (8, 30))}
WEIGHTS = {"short": 0.5, "long": 0.3, "mid": 0.2}
FLAGS = ["--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2",
         "--seq-length", str(BUDGET), "--lr", "1e-3", "--micro-batch-size", "1",
         "--tokenizer-type", "ByteLevelTokenizer", "--sequence-packing",
         "--packing-unit", "document", "--max-seqlen-per-dp-cp-rank", str(BUDGET),
         "--seed", str(SEED), "--eval-iters", "1"]


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """name -> (prefix, the documents written)."""
    folder = tmp_path_factory.mktemp("blend")
    return {name: (prefix, write_corpus(prefix, count, seed=index, id_range=ids, tokens=tokens))
            for index, (name, (count, ids, tokens)) in enumerate(CORPORA.items())
            for prefix in [str(folder / name)]}


def _build(data_flags: list[str], num_samples: int, batch: int = 100):
    run = parse_run_config(FLAGS + data_flags + ["--global-batch-size", str(batch),
                                                 "--train-iters", str(num_samples // batch)],
                           world_size=1)
    return build_datasets(run, ByteLevelTokenizer())


def _pieces(document: np.ndarray) -> list[tuple[int, ...]]:
    """A document's pieces as id tuples (tokens and the label after them), cut by hand."""
    tokens = len(document) - 1
    return [tuple(document[start: start + min(BUDGET, tokens - start) + 1].tolist())
            for start in range(0, tokens, BUDGET)]


def _split_documents(documents: list, split: int) -> list:
    """megatron-core's document ranges of --split 90,10,0: [0, round(0.9 N)), [.., N)."""
    cut = int(round(TRAIN_SHARE * len(documents)))
    return documents[:cut] if split == 0 else documents[cut:]


def _read(sample: dict) -> tuple[int, ...]:
    """The ids of a sample's piece: its tokens and its last label."""
    n = sample["length"]
    return tuple(sample["tokens"][:n].tolist()) + (int(sample["labels"][n - 1]),)


def _source(piece: tuple[int, ...]) -> str:
    first = piece[0]  # never eod: a piece's eod is its last id
    return next(name for name, (_, (low, high), _) in CORPORA.items() if low <= first < high)


def _hand_sample_weights(corpora, names, weights, split: int) -> np.ndarray:
    """w_d / mean_d, normalised; mean_d = the split's training tokens / its pieces, from the
    documents; no weights: each dataset's training tokens (megatron-core weighs by size)."""
    pieces = [[p for doc in _split_documents(corpora[name][1], split) for p in _pieces(doc)]
              for name in names]
    tokens = np.array([sum(len(p) - 1 for p in ps) for ps in pieces], dtype=np.float64)
    means = tokens / np.array([len(ps) for ps in pieces])
    per_sample = (tokens if weights is None else np.array(weights)) / means
    return per_sample / per_sample.sum()


def _megatron_core_sources(weights: np.ndarray, num_samples: int) -> np.ndarray:
    dataset_index = np.zeros(num_samples, dtype=np.int16)
    sample_index = np.zeros(num_samples, dtype=np.int64)
    helpers_cpp.build_blending_indices(dataset_index, sample_index, weights, len(weights),
                                       num_samples, False)
    return dataset_index


NUM_SAMPLES = 3000  # every dataset gets several epochs (the least drawn, "mid", about 10)


@pytest.fixture(scope="module")
def weighted(corpora):
    names = list(CORPORA)
    flags = ["--data-path"] + [e for n in names for e in (str(WEIGHTS[n]), corpora[n][0])]
    train, valid = _build(flags + ["--split", "90,10,0"], NUM_SAMPLES)
    return [_read(train[i]) for i in range(len(train))], [_read(s) for s in valid]


@pytest.mark.parametrize("weighted_flags", [True, False])
def test_sources_are_megatron_cores_blend_of_token_weights(corpora, weighted, weighted_flags):
    names = list(CORPORA)
    if weighted_flags:
        train, valid = weighted
        weights = [WEIGHTS[n] for n in names]
    else:
        train, valid = _build(["--data-path"] + [corpora[n][0] for n in names]
                              + ["--split", "90,10,0"], 1000)
        train, valid = [_read(s) for s in train], [_read(s) for s in valid]
        weights = None
    for split, pieces in ((0, train), (1, valid)):
        hand = _hand_sample_weights(corpora, names, weights, split)
        expected = [names[d] for d in _megatron_core_sources(hand, len(pieces))]
        assert [_source(p) for p in pieces] == expected
        allowed = {p for n in names for doc in _split_documents(corpora[n][1], split)
                   for p in _pieces(doc)}
        assert set(pieces) <= allowed  # each split reads its own documents only


def test_each_dataset_gives_its_weights_share_of_the_tokens(weighted):
    train, _ = weighted
    tokens = Counter()
    for piece in train:
        tokens[_source(piece)] += len(piece) - 1
    total = sum(tokens.values())
    # Whole epochs of a dataset hold exactly their expected tokens. What is left: the last,
    # partial epoch of each (r of its P <= 55 pieces of 1..24 tokens, drawn without
    # replacement: its sum's standard deviation is under 8 * sqrt(P) / 2 < 30 tokens), and
    # megatron-core's counts, off by at most one sample (<= 24 tokens): together a few tens of
    # the ~25,000 tokens, while 0.01 of the share is 250 (about 8 standard deviations). Drawing
    # the datasets by w_d alone would give "short" 0.25 of the tokens instead of 0.5.
    for name, weight in WEIGHTS.items():
        assert abs(tokens[name] / total - weight) < 0.01, (name, tokens[name] / total)


def test_every_piece_is_read_once_per_epoch_of_its_dataset(corpora, weighted):
    train, _ = weighted
    for name, (_, documents) in corpora.items():
        expected = Counter(p for doc in _split_documents(documents, 0) for p in _pieces(doc))
        reads = [piece for piece in train if _source(piece) == name]
        epoch = sum(expected.values())
        assert len(reads) >= 2 * epoch, name  # at least two epochs to count
        for first in range(0, len(reads) - epoch + 1, epoch):
            assert Counter(reads[first: first + epoch]) == expected, (name, first)


@pytest.mark.parametrize("data_flags", [["--data-path", "{a}", "--split", "90,10,0"],
                                        ["--data-path", "0.4", "{a}", "--split", "90,10,0"],
                                        ["--train-data-path", "{a}", "--valid-data-path", "{b}"]])
def test_one_dataset_reads_what_it_read_before_blends(corpora, data_flags):
    a, b = corpora["short"][0], corpora["long"][0]
    train, valid = _build([flag.format(a=a, b=b) for flag in data_flags], 120, batch=4)
    for dataset, prefix, split in ((train, a, 0), (valid, b if "{b}" in data_flags else a, 1)):
        core = IndexedDataset(prefix)
        begin, end = (0, len(core))
        if "--split" in data_flags:
            cut = int(round(TRAIN_SHARE * len(core)))
            begin, end = (0, cut) if split == 0 else (cut, len(core))
        direct = WholeDocumentDataset(core.__getitem__, core.sequence_lengths[begin:end],
                                      np.arange(begin, end), len(dataset), BUDGET, SEED,
                                      BYTE_PAD)
        for i in range(len(dataset)):
            ours, theirs = dataset[i], direct[i]
            assert ours.keys() == theirs.keys()
            for key, value in theirs.items():
                assert (ours[key] == value).all() if hasattr(value, "all") else \
                    ours[key] == value, (i, key)


def test_blend_refusals_that_still_apply(corpora, tmp_path):
    a, b = corpora["short"][0], corpora["long"][0]
    with pytest.raises(ArgumentValidationError,
                       match=f"--data-path: entry 3 gives '{b}' a weight of 0"):
        _build(["--data-path", "0.5", a, "0", b], 100)
    with pytest.raises(ArgumentValidationError, match="entry 4 .* names the dataset of entry 2"):
        _build(["--data-path", "0.5", a, "0.5", a], 100)
    with pytest.raises(ValueError, match=f"--split '99,1,0' leaves the validation split of "
                                         f"{a} empty"):
        _build(["--data-path", "0.5", a, "0.5", b, "--split", "99,1,0"], 100)
    # documents of one id each: tokens to read, none to train on; the message names the dataset
    ones = write_documents(str(tmp_path / "ones"), [np.array([5])] * 10)
    with pytest.raises(ValueError, match=f"none of the split's 9 documents of {ones} has a "
                                         f"token to train on"):
        _build(["--data-path", "0.5", a, "0.5", ones, "--split", "90,10,0"], 100)


def test_a_longer_run_reads_the_same_first_samples(corpora, weighted):
    """Sample i depends on (--seed, i) only: a run of fewer samples reads the same first ones
    (what a resumed run continues)."""
    names = list(CORPORA)
    flags = ["--data-path"] + [e for n in names for e in (str(WEIGHTS[n]), corpora[n][0])]
    train, _ = _build(flags + ["--split", "90,10,0"], 500)
    assert [_read(sample) for sample in train] == weighted[0][:500]


def test_the_cached_table_reads_the_same_samples(corpora, weighted, tmp_path):
    """--data-cache-path: the sample table saved by the first build and memory-mapped by both
    (blending_cache.py) gives what the in-memory table gave."""
    names = list(CORPORA)
    flags = ["--data-path"] + [e for n in names for e in (str(WEIGHTS[n]), corpora[n][0])]
    flags += ["--split", "90,10,0", "--data-cache-path", str(tmp_path)]
    for _ in range(2):  # saved, then read back
        train, valid = _build(flags, NUM_SAMPLES)
        assert ([_read(train[i]) for i in range(len(train))],
                [_read(s) for s in valid]) == weighted
    assert len(list(tmp_path.glob("*-WholeDocumentBlend-*.npy"))) == 4  # train and valid
