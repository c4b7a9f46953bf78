"""CP split of packed and plain batches: the rule, its inverse, and the upstream pitfalls."""

import pytest
import torch

from megatron.varlen.packing.cp_split import (
    get_thd_partition_indices,
    get_thd_restore_order,
    restore_sbhd_from_cp_shards,
    restore_thd_from_cp_shards,
    split_sbhd_for_cp,
    split_thd_for_cp,
)

# Real lengths {7, 16, 33, 1} padded to multiples of 8 (= 2 * cp for cp 4).
REAL_LENGTHS = [7, 16, 33, 1]
PADDED_LENGTHS = [8, 16, 40, 8]


def _cu(lengths):
    return torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.long)


def _expected_indices(padded_lengths, cp_size, cp_rank):
    """The rule, spelled out: per sequence, chunks r and 2cp-1-r of its padded span."""
    out, start = [], 0
    for length in padded_lengths:
        chunk = length // (2 * cp_size)
        for c in (cp_rank, 2 * cp_size - 1 - cp_rank):
            out.extend(range(start + c * chunk, start + (c + 1) * chunk))
        start += length
    return out


@pytest.mark.parametrize("cp_size", [2, 4])
def test_partition_indices_follow_the_rule(cp_size):
    cu = _cu(PADDED_LENGTHS)
    for rank in range(cp_size):
        got = get_thd_partition_indices(cu, cp_size, rank).tolist()
        assert got == _expected_indices(PADDED_LENGTHS, cp_size, rank)


def test_cp1_keeps_everything_without_divisibility():
    cu = _cu(REAL_LENGTHS)  # odd lengths are fine without CP
    assert get_thd_partition_indices(cu, 1, 0).tolist() == list(range(sum(REAL_LENGTHS)))


@pytest.mark.parametrize("cp_size", [2, 4])
def test_split_is_per_sequence_not_over_the_stream(cp_size):
    """Pitfall MLM #5191: every rank must hold 1/cp of EACH sequence, in sequence order."""
    cu = _cu(PADDED_LENGTHS)
    seq_id = torch.repeat_interleave(torch.arange(4), torch.tensor(PADDED_LENGTHS))
    expected = torch.repeat_interleave(torch.arange(4), torch.tensor(PADDED_LENGTHS) // cp_size)
    for rank in range(cp_size):
        assert torch.equal(split_thd_for_cp(seq_id, cu, cp_size, rank, seq_dim=0), expected)


def test_padded_boundaries_are_used_not_real_ones():
    """Pitfall MLM #4494: chunk boundaries from real lengths leak tokens across sequences."""
    cu_real, cu_padded = _cu([4, 12]), _cu([8, 12])  # sequence 0 has 4 padding slots
    seq_id = torch.repeat_interleave(torch.arange(2), torch.tensor([8, 12]))
    for rank in range(2):
        kept = seq_id[get_thd_partition_indices(cu_padded, 2, rank)]
        assert kept.tolist() == [0] * 4 + [1] * 6
    # what the real boundaries would have done: sequence 1's chunks start in 0's padding
    leaked = seq_id[get_thd_partition_indices(cu_real, 2, 1)]
    assert leaked.tolist() != [0] * 2 + [1] * 6


def test_indivisible_padded_length_names_sequence_length_and_divisor():
    with pytest.raises(ValueError, match=r"sequence 2 has padded length 33.*2\*cp_size = 4"):
        get_thd_partition_indices(_cu([8, 16, 33, 4]), 2, 1)


@pytest.mark.parametrize("bad", [dict(cp_size=0, cp_rank=0), dict(cp_size=2, cp_rank=2)])
def test_bad_rank_arguments_raise(bad):
    with pytest.raises(ValueError):
        get_thd_partition_indices(_cu([8]), **bad)


def test_split_checks_the_token_count():
    with pytest.raises(ValueError, match="expected 32"):
        split_thd_for_cp(torch.zeros(30), _cu([16, 16]), 2, 0, seq_dim=0)


@pytest.mark.parametrize("cp_size", [1, 2, 4])
def test_thd_round_trip(cp_size):
    cu = _cu(PADDED_LENGTHS)
    full = torch.randn(2, int(cu[-1]), 3)
    shards = [split_thd_for_cp(full, cu, cp_size, r, seq_dim=1) for r in range(cp_size)]
    assert sum(s.size(1) for s in shards) == full.size(1)
    assert torch.equal(restore_thd_from_cp_shards(shards, cu, seq_dim=1), full)
    order = get_thd_restore_order(cu, cp_size)
    assert torch.equal(torch.cat(shards, 1)[:, order], full)


@pytest.mark.parametrize("cp_size", [2, 4])
def test_sbhd_round_trip_and_rule(cp_size):
    full = torch.arange(16).view(16, 1).expand(16, 3)  # [S, b]
    shards = [split_sbhd_for_cp(full, cp_size, r, seq_dim=0) for r in range(cp_size)]
    assert shards[0][:, 0].tolist() == _expected_indices([16], cp_size, 0)
    assert torch.equal(restore_sbhd_from_cp_shards(shards, seq_dim=0), full)


def _partition_ops(num_sequences: int, cp_size: int) -> dict:
    from megatron.varlen.platform.host_syncs import count_dispatches

    cu = _cu([4 * cp_size] * num_sequences)
    with count_dispatches() as counts:
        get_thd_partition_indices(cu, cp_size, 0)
    ops = {}
    for (op, _), n in counts.items():
        ops[op] = ops.get(op, 0) + n
    return ops


@pytest.mark.parametrize("cp_size", [1, 2])
def test_partition_index_work_does_not_grow_with_the_sequences(cp_size):
    # Host work per micro-batch (MoE's sequence map, the local attention layout, the data
    # path's split): one repeat_interleave with CP, none without; the same for 4 or 64
    # sequences. The values are the rule's (tests above).
    few, many = _partition_ops(4, cp_size), _partition_ops(64, cp_size)
    assert few == many
    assert many.get("repeat_interleave", 0) == (0 if cp_size == 1 else 1), many
    assert torch.equal(get_thd_partition_indices(_cu([8] * 64), 1, 0), torch.arange(512))
