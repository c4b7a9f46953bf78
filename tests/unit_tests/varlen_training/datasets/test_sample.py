"""Tests for megatron/varlen_training/datasets/sample.py: padding multiple, sample layout,
collation."""

import numpy as np
import pytest
import torch

from megatron.varlen_training.datasets import collate_padded, get_pad_multiple, make_sample
from megatron.varlen_training.datasets.sample import SAMPLE_KEYS

PAD = 99


@pytest.mark.parametrize(
    "cp, tp, sp, expected",
    [
        (1, 1, False, 1),
        (1, 4, False, 1),
        (1, 4, True, 4),
        (2, 1, False, 4),
        (2, 4, False, 4),
        (2, 4, True, 16),
        (3, 2, True, 12),
        (8, 1, True, 16),
    ],
)
def test_get_pad_multiple(cp, tp, sp, expected):
    assert get_pad_multiple(cp, tp, sp) == expected


def test_get_pad_multiple_rejects_zero_sizes():
    with pytest.raises(ValueError, match="--context-parallel-size 0"):
        get_pad_multiple(0, 1, False)


@pytest.mark.parametrize("length", [1, 2, 3, 7, 8, 9, 31])
@pytest.mark.parametrize("multiple", [1, 2, 4, 16])
def test_make_sample_padding_invariants(length, multiple):
    document = np.arange(10, 10 + length + 1)
    sample = make_sample(document, None, 5, PAD, multiple)
    padded = sample["padded_length"]
    assert set(sample) == set(SAMPLE_KEYS)
    assert padded % multiple == 0 and length <= padded < length + multiple
    assert sample["length"] == length and sample["sample_id"] == 5
    assert sample["tokens"].dtype == torch.long and sample["labels"].dtype == torch.long
    assert sample["loss_mask"].dtype == torch.float and sample["position_ids"].dtype == torch.long
    for key in ("tokens", "labels", "loss_mask", "position_ids"):
        assert sample[key].shape == (padded,)
    assert sample["tokens"][:length].tolist() == document[:-1].tolist()
    assert sample["labels"][:length].tolist() == document[1:].tolist()
    assert (sample["tokens"][length:] == PAD).all() and (sample["labels"][length:] == PAD).all()
    assert sample["loss_mask"].tolist() == [1.0] * length + [0.0] * (padded - length)
    assert sample["position_ids"].tolist() == list(range(padded))
    assert sample["num_loss_tokens"] == length


def test_make_sample_exact_padded_length_and_targets():
    document = np.array([5, 6, 7, 8])
    is_target = np.array([False, False, True, True])
    sample = make_sample(document, is_target, 0, PAD, padded_length=6)
    assert sample["padded_length"] == 6 and sample["length"] == 3
    assert sample["loss_mask"].tolist() == [0.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    assert sample["num_loss_tokens"] == 2


def test_make_sample_shares_no_memory_with_document():
    document = np.array([1, 2, 3])
    sample = make_sample(document, None, 0, PAD)
    document[:] = 0
    assert sample["tokens"].tolist() == [1, 2]


def test_collate_padded_stacks():
    samples = [make_sample(np.array([1, 2, 3]), None, i, PAD, padded_length=4) for i in range(3)]
    batch = collate_padded(samples)
    assert set(batch) == {"tokens", "labels", "loss_mask", "position_ids"}
    assert all(v.shape == (3, 4) for v in batch.values())
    assert batch["tokens"][1].tolist() == [1, 2, PAD, PAD]


def test_collate_padded_rejects_mixed_lengths_and_empty():
    samples = [make_sample(np.array([1, 2, 3]), None, 0, PAD), make_sample([1, 2], None, 1, PAD)]
    with pytest.raises(ValueError, match=r"different padded lengths \[1, 2\]"):
        collate_padded(samples)
    with pytest.raises(ValueError, match="no samples"):
        collate_padded([])
