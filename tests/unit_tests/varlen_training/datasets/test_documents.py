"""Documents inside pretraining samples (megatron/varlen_training/datasets/documents.py).

References, none taken from the code under test: megatron-core's own
``gpt_dataset._get_ltor_masks_and_position_ids`` and ``GPTDataset`` (built here from a tiny
.bin/.idx written with ``IndexedDatasetBuilder``) for Megatron-LM's three flags, and the
attention of each document computed alone (float64) for the dense mask and the THD pieces.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from megatron.core.datasets.gpt_dataset import (
    GPTDataset, GPTDatasetConfig, _get_ltor_masks_and_position_ids,
)
from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder
from megatron.core.datasets.utils import Split

from megatron.varlen.attention.core_attention import (
    _sbhd_layout, attend_with_layout, build_local_layout,
)
from megatron.varlen.scheduling import length_sums
from megatron.varlen_training.datasets.documents import (
    DocumentResets, apply_document_resets, document_lengths, document_spans,
    packed_document_split, split_documents,
)
from megatron.varlen_training.datasets.sample import collate_padded, make_sample

EOD, PAD, VOCAB = 99, 98, 100
ALL_RESETS = [DocumentResets(*flags) for flags in itertools.product((False, True), repeat=3)]


def _sample(tokens: list[int], last_label: int = 7, sample_id: int = 0) -> dict:
    """A pretraining sample whose input tokens are ``tokens`` (every label trained)."""
    return make_sample(np.array(tokens + [last_label]), None, sample_id, PAD)


def _random_tokens(rng, size: int, eod_rate: float) -> list[int]:
    tokens = rng.integers(0, 90, size)
    tokens[rng.random(size) < eod_rate] = EOD
    return tokens.tolist()


HAND_MADE = [
    [5, 9, 1, 6, 9, 7],                 # no eod
    [5, EOD, 1, 6, EOD, 7],             # two cuts
    [EOD, 3, 4],                        # eod first
    [3, 4, EOD],                        # eod last: no empty piece after it
    [EOD, EOD, 2, EOD, EOD],            # consecutive eods: one-token documents
]


def test_document_spans_cover_the_real_tokens_once():
    assert document_spans(torch.tensor(HAND_MADE[1]), 6, EOD) == [(0, 2), (2, 5), (5, 6)]
    assert document_spans(torch.tensor(HAND_MADE[3]), 3, EOD) == [(0, 3)]
    assert document_spans(torch.tensor(HAND_MADE[4]), 5, EOD) == [(0, 1), (1, 2), (2, 4), (4, 5)]
    # Only the real tokens count: an eod in the padding makes no span.
    assert document_spans(torch.tensor([1, 2, EOD, EOD]), 2, EOD) == [(0, 2)]


@pytest.mark.parametrize("resets", ALL_RESETS, ids=str)
@pytest.mark.parametrize("case", range(len(HAND_MADE) + 20))
def test_resets_equal_megatron_core(resets, case):
    """Our masks and positions == megatron-core's function on the same tokens, every flag."""
    tokens = HAND_MADE[case] if case < len(HAND_MADE) else \
        _random_tokens(np.random.default_rng(case), 24, 0.15)
    sample = apply_document_resets(_sample(tokens), EOD, resets)
    mask, loss_mask, positions = _get_ltor_masks_and_position_ids(
        torch.tensor(tokens), EOD, resets.reset_position_ids, resets.reset_attention_mask,
        resets.eod_mask_loss, create_attention_mask=True)
    assert torch.equal(sample["loss_mask"], loss_mask)
    assert sample["num_loss_tokens"] == int(loss_mask.sum())
    assert torch.equal(sample["position_ids"], positions)
    if resets.reset_attention_mask:
        assert torch.equal(sample["attention_mask"], mask)
    else:
        assert "attention_mask" not in sample  # plain causal: no dense mask is built


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A tiny indexed dataset: documents of very different lengths, each ending in eod."""
    prefix = str(tmp_path_factory.mktemp("corpus") / "text_document")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    rng = np.random.default_rng(0)
    for length in (3, 10, 1, 25, 7, 40, 2, 5, 0, 12):
        builder.add_document(np.append(rng.integers(0, 90, length), EOD), [length + 1])
    builder.finalize(prefix + ".idx")
    return prefix


class _Tokenizer:
    eod, pad, vocab_size = EOD, PAD, VOCAB
    unique_identifiers = {"class": "test tokenizer"}


def _gpt_dataset(prefix: str, resets: DocumentResets, num_samples: int = 8) -> GPTDataset:
    config = GPTDatasetConfig(
        random_seed=1, sequence_length=16, split="1,0,0", tokenizer=_Tokenizer(),
        reset_position_ids=resets.reset_position_ids,
        reset_attention_mask=resets.reset_attention_mask, eod_mask_loss=resets.eod_mask_loss,
        path_to_cache=None, mmap_bin_files=False)
    indexed = IndexedDataset(prefix, mmap=False)
    return GPTDataset(indexed, prefix, np.arange(len(indexed)), num_samples, Split.train, config)


def _as_our_sample(gpt_sample: dict, idx: int) -> dict:
    document = torch.cat([gpt_sample["tokens"], gpt_sample["labels"][-1:]]).numpy()
    return make_sample(document, None, idx, PAD)


@pytest.mark.parametrize("resets", ALL_RESETS[1:], ids=str)
def test_resets_on_gpt_dataset_samples_equal_its_own(corpus, resets):
    """megatron-core's GPTDataset with the flags on == its flags-off samples + our transform."""
    plain, reference = _gpt_dataset(corpus, DocumentResets()), _gpt_dataset(corpus, resets)
    for idx in range(len(plain)):
        ours = apply_document_resets(_as_our_sample(plain[idx], idx), EOD, resets)
        theirs = reference[idx]
        assert torch.equal(ours["tokens"], theirs["tokens"])
        assert torch.equal(ours["loss_mask"], theirs["loss_mask"])
        assert torch.equal(ours["position_ids"], theirs["position_ids"])
        if resets.reset_attention_mask:
            assert torch.equal(ours["attention_mask"], theirs["attention_mask"])


def test_pieces_reassemble_the_sample(corpus):
    """Every real token, label and loss-mask entry is in exactly one piece, in order."""
    dataset = _gpt_dataset(corpus, DocumentResets())
    for idx in range(len(dataset)):
        sample = _as_our_sample(dataset[idx], idx)
        pieces = split_documents(sample, EOD, PAD, pad_to_multiple_of=4)
        for key in ("tokens", "labels", "loss_mask"):
            joined = torch.cat([p[key][: p["length"]] for p in pieces])
            assert torch.equal(joined, sample[key][: sample["length"]]), key
        for piece in pieces:
            assert piece["padded_length"] % 4 == 0 and piece["padded_length"] >= piece["length"]
            assert torch.equal(piece["position_ids"][: piece["length"]],
                               torch.arange(piece["length"]))
            # A piece ends at its eod: no eod input inside it but at its end.
            inner = piece["tokens"][: piece["length"] - 1]
            assert not bool((inner == EOD).any())
        assert sum(p["num_loss_tokens"] for p in pieces) == sample["num_loss_tokens"]


def test_packed_split_trains_the_tokens_the_unpacked_flags_train():
    """Loss on the same (input, label) pairs: packed pieces vs unpacked with the three flags."""
    rng = np.random.default_rng(3)
    all_flags = DocumentResets(True, True, True)
    for _ in range(20):
        sample = _sample(_random_tokens(rng, 32, 0.2))
        unpacked = apply_document_resets(sample, EOD, all_flags)
        pieces = packed_document_split(all_flags, EOD, PAD)(sample)

        def trained(tokens, labels, mask):
            return [(int(t), int(l)) for t, l, m in zip(tokens, labels, mask) if m > 0]

        expected = trained(unpacked["tokens"], unpacked["labels"], unpacked["loss_mask"])
        got = [pair for p in pieces for pair in trained(p["tokens"][: p["length"]],
                                                        p["labels"][: p["length"]],
                                                        p["loss_mask"][: p["length"]])]
        assert got == expected
        # ... and the position each trained token sits at restarts per document in both.
        positions = [int(pos) for pos, m in zip(unpacked["position_ids"], unpacked["loss_mask"])
                     if m > 0]
        assert positions == [pos for p in pieces for pos, m in
                             zip(range(p["length"]), p["loss_mask"]) if m > 0]


def _reference_attention(q, k, v, scale):
    """One document's causal attention, float64, nothing else in view."""
    scores = torch.einsum("qnd,knd->nqk", q, k) * scale
    causal = torch.ones(q.size(0), k.size(0), dtype=torch.bool).tril()
    probs = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
    return torch.einsum("nqk,knd->qnd", probs, v)


def test_dense_mask_and_thd_pieces_attend_like_each_document_alone():
    """SBHD with the --reset-attention-mask mask == THD over the pieces == each document
    attended alone (float64): no attention crosses a document either way."""
    torch.manual_seed(0)
    tokens = [1, 2, EOD, 3, 4, 5, EOD, EOD, 6, 7, 8, 9]
    sample = apply_document_resets(_sample(tokens), EOD, DocumentResets(False, True, False))
    seq, heads, dim, scale = len(tokens), 2, 4, 0.5
    q, k, v = (torch.randn(seq, heads, dim, dtype=torch.float64) for _ in range(3))
    expected = torch.cat([_reference_attention(q[a:b], k[a:b], v[a:b], scale)
                          for a, b in document_spans(torch.tensor(tokens), seq, EOD)])

    class _Single:
        def size(self):
            return 1

        def rank(self):
            return 0

    batch = collate_padded([sample])
    dense = attend_with_layout(q, k, v, _sbhd_layout(1, seq, 1, 0, "cpu"), _Single(), True,
                               scale, blocked_nqk=batch["attention_mask"][:, 0])
    torch.testing.assert_close(dense, expected, rtol=1e-12, atol=1e-12)
    spans = document_spans(torch.tensor(tokens), seq, EOD)
    cu = torch.tensor([0] + [b for _, b in spans])
    thd = attend_with_layout(q, k, v, build_local_layout(cu, cu, 1, 0, torch.device("cpu")),
                             _Single(), True, scale)
    torch.testing.assert_close(thd, expected, rtol=1e-12, atol=1e-12)


def test_document_lengths_count_documents_in_float64():
    rng = np.random.default_rng(5)
    samples = [_sample(_random_tokens(rng, 40, 0.1)) for _ in range(6)]
    lengths = np.array([b - a for s in samples
                        for a, b in document_spans(s["tokens"], s["length"], EOD)],
                       dtype=np.float64)
    window = 3  # a sliding window counts each document's own band: 2 * pairs - min(L, w + 1)
    total, squares, windowed = length_sums(document_lengths(samples, EOD), window)
    assert float(total) == lengths.sum() == 6 * 40
    assert float(squares) == (lengths ** 2).sum()
    band = np.minimum(lengths, window + 1)
    pairs = sum(np.tril(np.triu(np.ones((int(n), int(n))), -window)).sum() for n in lengths)
    assert float(windowed) == 2 * pairs - band.sum() < squares
