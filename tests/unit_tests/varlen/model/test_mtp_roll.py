"""MTP's roll within packed sequences (megatron/varlen/model/mtp_roll.py) equals megatron-core's.

The reference is megatron-core 0.16.1's own ``roll_tensor`` (its loop over the sequences), on
the same tensors and boundaries: the rolled tensor and its sum must be bitwise equal, over
random packs with empty sequences, several dtypes and a leading batch dimension. Operator
counts show the point of it: a fixed number of operations whatever the number of sequences.
"""

import random

import pytest
import torch
from megatron.core.transformer import multi_token_prediction as mcore_mtp

from megatron.varlen.model.mtp_roll import packed_roll, rolling_within_sequences
from megatron.varlen.packing.packed_seq import varlen_packed_seq_params
from megatron.varlen.platform.host_syncs import count_dispatches


class _Group:
    def __init__(self, size):
        self._size = size

    def size(self):
        return self._size


def _params(lengths):
    cu = torch.tensor([0, *lengths], dtype=torch.int32).cumsum(0).to(torch.int32)
    return varlen_packed_seq_params(cu, cu, cu, cu, max(lengths), 1)


def _random_lengths(rng):
    return [rng.choice([0, 1, 2, rng.randint(3, 12)]) for _ in range(rng.randint(1, 8))]


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("dtype", [torch.int64, torch.float32, torch.bool])
def test_packed_roll_equals_megatron_cores_loop(seed, dtype):
    rng = random.Random(seed)
    lengths = _random_lengths(rng)
    if sum(lengths) == 0:
        lengths.append(3)
    params = _params(lengths)
    tensor = (torch.randn(2, sum(lengths), generator=torch.Generator().manual_seed(seed)) * 5)
    tensor = tensor > 0 if dtype is torch.bool else tensor.to(dtype)
    got, got_sum = packed_roll(mcore_mtp.roll_tensor, tensor, -1, -1, None, params)
    expected, expected_sum = mcore_mtp.roll_tensor(tensor, -1, -1, None, params)
    assert got.dtype == expected.dtype and torch.equal(got, expected)
    assert torch.equal(got_sum, expected_sum)
    assert torch.equal(tensor, tensor.clone())  # the input is left as it was


def test_where_it_does_not_apply_it_is_megatron_cores():
    calls = []

    def original(*args, **kwargs):
        calls.append(kwargs)
        return "original"

    params, tensor = _params([3, 4]), torch.arange(7)
    assert packed_roll(original, tensor, -1, -1, _Group(2), params) == "original"  # CP
    assert packed_roll(original, tensor, -1, -1, None, None) == "original"  # not packed
    assert packed_roll(original, tensor[:5], -1, -1, None, params) == "original"  # short
    assert len(calls) == 3


def _roll_ops(num_sequences):
    params = _params([512 // num_sequences] * num_sequences)
    tensor = torch.arange(512)[None]
    packed_roll(mcore_mtp.roll_tensor, tensor, -1, -1, None, params)  # per-micro-batch build
    counts = {}
    for fn in ("ours", "megatron-core"):
        roll = (lambda t: packed_roll(mcore_mtp.roll_tensor, t, -1, -1, None, params)) \
            if fn == "ours" else (lambda t: mcore_mtp.roll_tensor(t, -1, -1, None, params))
        with count_dispatches() as table:
            roll(tensor)
        counts[fn] = sum(table.values())
    return counts


def test_operator_calls_do_not_grow_with_the_sequences():
    few, many = _roll_ops(4), _roll_ops(64)
    assert few["ours"] == many["ours"] == 3, (few, many)  # roll, index_fill_, sum
    assert many["megatron-core"] > 10 * few["ours"]  # what it replaces: a loop over sequences


def test_the_block_routes_megatron_cores_callers_and_restores_them():
    from megatron.core.models.gpt import gpt_model

    before = (mcore_mtp.roll_tensor, gpt_model.roll_tensor)
    with rolling_within_sequences():
        inside = (mcore_mtp.roll_tensor, gpt_model.roll_tensor)
        with rolling_within_sequences():  # re-entrant
            assert (mcore_mtp.roll_tensor, gpt_model.roll_tensor) == inside
        params, tensor = _params([2, 3]), torch.arange(5)
        assert torch.equal(gpt_model.roll_tensor(tensor, -1, -1, None, params)[0],
                           torch.tensor([1, 0, 3, 4, 0]))
    assert inside[0] is inside[1] and inside[0] is not before[0]
    assert (mcore_mtp.roll_tensor, gpt_model.roll_tensor) == before
