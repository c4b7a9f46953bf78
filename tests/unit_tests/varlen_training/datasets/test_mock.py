"""Tests for megatron/varlen_training/datasets/mock.py."""


import numpy as np
import pytest
import torch

from megatron.varlen_training.datasets import MockGPTDataset, MockSFTDataset


class FixedLengths:
    """Stand-in for length_config.LengthConfig: repeats ``values``; the seed shifts the start."""

    def __init__(self, values):
        self.values = np.asarray(values, dtype=np.int64)

    def sample(self, num_samples, seed):
        return np.roll(np.resize(self.values, num_samples), seed % max(num_samples, 1))


def _mock_sft(lengths=(1, 2, 3, 5, 8, 13), num_samples=12, seed=3, **kwargs):
    kwargs.setdefault("vocab_size", 8)
    kwargs.setdefault("eod", kwargs["vocab_size"] - 1)
    return MockSFTDataset(
        num_samples, 16, seed=seed, length_config=FixedLengths(lengths), **kwargs
    )


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


@pytest.mark.parametrize(
    "make", [lambda s: MockGPTDataset(10, 9, 50, s, 49), lambda s: _mock_sft(seed=s)]
)
def test_deterministic_across_instances_and_order(make):
    first, second = make(7), make(7)
    forward = [first[i] for i in range(len(first))]
    backward = [second[i] for i in reversed(range(len(second)))][::-1]
    for a, b in zip(forward, backward):
        _assert_same(a, b)
    _assert_same(make(7)[4], forward[4])  # a single index read alone
    other = make(8)
    assert any(not torch.equal(a["tokens"], other[i]["tokens"]) for i, a in enumerate(forward))


@pytest.mark.parametrize(
    "vocab_size, eod", [(8, 7), (8, 0), (8, 3), (2, 1), (2, 0), (50_000, 49_999)]
)
def test_ids_below_vocab_and_eod_only_at_document_end(vocab_size, eod):
    for ds in (
        MockGPTDataset(6, 33, vocab_size, 1, eod, pad_to_multiple_of=4),
        _mock_sft(vocab_size=vocab_size, eod=eod, pad_to_multiple_of=4),
    ):
        for i in range(len(ds)):
            s = ds[i]
            length = s["length"]
            assert 0 <= s["tokens"].min() and s["tokens"].max() < vocab_size
            assert 0 <= s["labels"].min() and s["labels"].max() < vocab_size
            assert (s["tokens"][:length] != eod).all()
            assert s["labels"][length - 1] == eod
            assert (s["labels"][: length - 1] != eod).all()


def test_gpt_fixed_length_and_label_shift():
    ds = MockGPTDataset(4, 11, 100, 5, 99)
    assert len(ds) == 4 and ds.lengths.tolist() == [11] * 4
    for i in range(len(ds)):
        s = ds[i]
        assert s["length"] == s["padded_length"] == 11 and s["sample_id"] == i
        assert torch.equal(s["labels"][:-1], s["tokens"][1:])
        assert s["loss_mask"].tolist() == [1.0] * 11


@pytest.mark.parametrize("multiple", [1, 2, 4, 6, 16])
def test_sft_padding_invariants(multiple):
    ds = _mock_sft(lengths=(1, 3, 5, 8, 15), pad_to_multiple_of=multiple)
    for i in range(len(ds)):
        s = ds[i]
        length, padded = s["length"], s["padded_length"]
        assert length == ds.lengths[i]
        assert padded % multiple == 0 and length <= padded < length + multiple
        assert torch.equal(s["labels"][: length - 1], s["tokens"][1:length])
        assert s["loss_mask"].tolist() == [1.0] * length + [0.0] * (padded - length)
        assert (s["tokens"][length:] == 7).all() and (s["labels"][length:] == 7).all()
        assert s["position_ids"].tolist() == list(range(padded))


def test_sft_pad_to_seq_length():
    ds = _mock_sft(lengths=(1, 16), pad_to_seq_length=True, pad_to_multiple_of=4)
    assert [ds[i]["padded_length"] for i in range(4)] == [16] * 4
    assert sorted({ds[i]["length"] for i in range(4)}) == [1, 16]


def test_sft_explicit_pad_id():
    s = _mock_sft(lengths=(3,), pad_to_multiple_of=4, pad=5)[0]
    assert s["tokens"][3] == 5 and s["labels"][3] == 5


def test_sft_clipping_count_and_single_warning(capsys):
    ds = _mock_sft(lengths=(0, 4, 17, 40), num_samples=8)
    assert ds.num_clipped == 6
    assert ds.lengths.min() == 1 and ds.lengths.max() == 16
    records = [line for line in capsys.readouterr().out.splitlines() if "clipped" in line]
    assert len(records) == 1 and "WARNING" in records[0] and "6 of 8" in records[0]
    assert "--seq-length 16" in records[0]


def test_samples_are_fresh_objects():
    ds = _mock_sft()
    first = ds[2]
    first["tokens"][0] = 123
    first["loss_mask"].zero_()
    first["length"] = -1
    del first["labels"]
    again = ds[2]
    assert again["tokens"][0] != 123 and again["loss_mask"][0] == 1.0
    assert again["length"] == ds.lengths[2] and "labels" in again


def test_index_errors_and_bad_arguments():
    ds = MockGPTDataset(3, 4, 10, 0, 9)
    with pytest.raises(IndexError):
        ds[3]
    assert len(list(ds)) == 3
    with pytest.raises(ValueError, match="--vocab-size >= 2, got 1"):
        MockGPTDataset(3, 4, 1, 0, 0)
    with pytest.raises(ValueError, match=r"eod id 10 is not in \[0, --vocab-size 10\)"):
        MockGPTDataset(3, 4, 10, 0, 10)
    with pytest.raises(ValueError, match="pad id 12"):
        MockGPTDataset(3, 4, 10, 0, 9, pad=12)
