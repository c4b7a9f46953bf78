"""Rerouting's host side: the send buffer and the split of the received one, with the same
values, in operator calls that do not grow with the number of samples.

reroute.unpack used to slice and copy each sample's field out of the received buffer (two
operator calls per sample and field, every step); it now makes one ``split``. _payload no
longer reshapes or slices a field that already is the sample's real tokens. Reference: each
field's first ``length`` entries, flattened and converted, written out here from Python lists
(``_expected``), over random samples that are padded, 2-D or of another dtype. Then the
operator counts of 4 and 64 samples are equal.
"""

import random

import pytest
import torch

from megatron.varlen.packing.reroute import _payload, unpack
from megatron.varlen.platform.host_syncs import count_dispatches

INT_FIELDS = ("tokens", "labels")
FLOAT_FIELDS = ("loss_mask", "weights")


def _samples(rng: random.Random, num: int, padded: bool, odd_layouts: bool) -> tuple:
    """({id: sample}, {id: real length}): ids are not 0..n-1, some tensors longer than the
    real length (padding), [L, 1] or int32 when ``odd_layouts``."""
    gen = torch.Generator().manual_seed(rng.randint(0, 10**6))
    samples, lengths = {}, {}
    for k in range(num):
        sid, length = 3 * k + 1, rng.randint(1, 9)
        size = length + (rng.randint(0, 4) if padded else 0)
        sample = {"tokens": torch.randint(0, 1000, (size,), generator=gen),
                  "labels": torch.randint(0, 1000, (size,), generator=gen),
                  "loss_mask": (torch.rand(size, generator=gen) > 0.5).float(),
                  "weights": torch.rand(size, generator=gen)}
        if odd_layouts and k % 3 == 1:
            sample["labels"] = sample["labels"].to(torch.int32).reshape(size, 1)
            sample["weights"] = sample["weights"].to(torch.float64)
        samples[sid], lengths[sid] = sample, length
    return samples, lengths


def _expected(samples: dict, lengths: dict, ids, field: str, cast) -> list:
    return [cast(v) for v in samples[ids][field].reshape(-1).tolist()[: lengths[ids]]]


def _round_trip(samples, lengths, recv_lists, fields, dtype) -> dict:
    """What a rank unpacks when each sender's part of the buffer is its _payload."""
    buffer = torch.cat([_payload(samples, ids, fields, lengths, dtype) for ids in recv_lists])
    received: dict = {}
    unpack(buffer, recv_lists, lengths, fields, received)
    return received


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("padded", [False, True])
def test_received_fields_equal_the_real_tokens(seed, padded):
    rng = random.Random(seed)
    samples, lengths = _samples(rng, rng.randint(1, 12), padded, odd_layouts=True)
    ids = list(samples)
    rng.shuffle(ids)
    cut = rng.randint(0, len(ids))
    recv_lists = [ids[:cut], [], ids[cut:]]  # three senders, one of them sending nothing
    for fields, dtype, cast in ((INT_FIELDS, torch.int64, int),
                                (FLOAT_FIELDS, torch.float32, float)):
        received = _round_trip(samples, lengths, recv_lists, fields, dtype)
        assert sorted(received) == sorted(ids)
        for sid in ids:
            assert sorted(received[sid]) == sorted(fields)
            for field in fields:
                got = received[sid][field]
                assert got.dtype == dtype and got.dim() == 1
                want = _expected(samples, lengths, sid, field,
                                 lambda v: cast(torch.tensor(v, dtype=dtype).item()))
                assert got.tolist() == want, (sid, field)


def test_nothing_to_receive():
    received: dict = {}
    unpack(torch.zeros(0, dtype=torch.int64), [[], []], {}, INT_FIELDS, received)
    assert received == {}


def test_samples_are_not_modified():
    samples, lengths = _samples(random.Random(0), 6, padded=True, odd_layouts=True)
    before = {sid: {k: v.clone() for k, v in s.items()} for sid, s in samples.items()}
    for fields, dtype in ((INT_FIELDS, torch.int64), (FLOAT_FIELDS, torch.float32)):
        for piece in _round_trip(samples, lengths, [list(samples)], fields, dtype).values():
            for tensor in piece.values():
                tensor.fill_(-1)  # the pieces are the rank's own: writing them changes no sample
    for sid, sample in samples.items():
        assert all(torch.equal(sample[k], before[sid][k]) for k in sample)


def _counts(num: int) -> dict:
    samples, lengths = _samples(random.Random(num), num, padded=False, odd_layouts=False)
    ids = list(samples)
    with count_dispatches() as counts:
        for fields, dtype in ((INT_FIELDS, torch.int64), (FLOAT_FIELDS, torch.float32)):
            _round_trip(samples, lengths, [ids[: num // 2], ids[num // 2:]], fields, dtype)
    return dict(counts)


def test_operator_calls_do_not_grow_with_the_samples():
    few, many = _counts(4), _counts(64)
    assert few == many, (few, many)
    # Per dtype: one cat per sender, the cat of the senders, one split.
    assert sum(few.values()) == 2 * (2 + 1 + 1), few
