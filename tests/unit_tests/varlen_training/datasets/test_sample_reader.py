"""--num-workers only moves reads ahead: worker processes return exactly the samples, in the
order, that reading in the training process gives, across iterations and after a jump."""

from __future__ import annotations

import os

import torch

from megatron.varlen_training.datasets.sample_reader import SampleReader

BATCH = 3


class _Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 30

    def __getitem__(self, idx):
        return {"tokens": torch.arange(idx, idx + 4) ** 2, "sample_id": idx, "pid": os.getpid()}


def _indices_of(iteration):
    return [iteration * BATCH + k for k in (2, 0, 1)]  # any order: the reader keeps it


def _reads(num_workers, iterations):
    reader = SampleReader(_Squares(), _indices_of, len(_Squares()) // BATCH, num_workers)
    return [reader.read(it) for it in iterations]


def test_workers_read_the_same_samples_in_the_same_order():
    iterations = [0, 1, 2, 5, 6, 3, 9]  # jumps forward and back restart the workers
    inline, ahead = _reads(0, iterations), _reads(2, iterations)
    for mine, theirs in zip(inline, ahead):
        assert [s["sample_id"] for s in mine] == [s["sample_id"] for s in theirs]
        assert all(torch.equal(a["tokens"], b["tokens"]) for a, b in zip(mine, theirs))
    assert {s["pid"] for batch in ahead for s in batch}.isdisjoint({os.getpid()})
    assert [s["sample_id"] for s in ahead[3]] == _indices_of(5)
