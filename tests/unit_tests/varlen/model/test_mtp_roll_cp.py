"""MTP's roll under CP (megatron/varlen/model/mtp_roll.py ``_roll_cp``) equals megatron-core's.

On 2 and 4 gloo ranks each holding its zigzag share of the same packs (many short sequences,
a few long ones, padding after the real tokens, pad-only fillers), the rolled tensor and its
sum must be bitwise equal to two independent references: megatron-core 0.16.1's own
``roll_tensor`` with the CP group (its loop over the sequences with point-to-point exchanges),
and the roll of the whole unsplit pack without CP, cut to this rank's rows. Counting shows the
point of it: per roll one collective and a fixed number of operators, with 4 or 64 sequences;
megatron-core's loop makes up to 4 point-to-point calls per sequence.
"""

import contextlib
import random

import pytest
import torch

from tests.harness.multirank import run_distributed

DTYPES = (torch.int64, torch.float32, torch.bool)
# The torch.distributed calls a roll may make, counted by name.
_COMMUNICATION = ("all_gather_single", "all_gather_into_tensor", "all_gather", "isend", "irecv",
                  "send", "recv", "batch_isend_irecv", "broadcast", "all_reduce")


def _padded_lengths(rng: random.Random, cp: int, num_short: int, num_long: int) -> list[int]:
    """Padded sequence lengths, multiples of 2 x cp as the packer makes them, shuffled."""
    unit = 2 * cp
    lengths = [unit * rng.randint(1, 2) for _ in range(num_short)]
    lengths += [unit * rng.randint(8, 20) for _ in range(num_long)]
    rng.shuffle(lengths)
    return lengths


def _pack_values(rng: random.Random, padded: list[int], dtype, rows: int) -> torch.Tensor:
    """[rows, T] values of a pack: real tokens, then 0 on each sequence's padding (one in
    four sequences is a pad-only filler)."""
    generator = torch.Generator().manual_seed(rng.randint(0, 2**31))
    values = torch.randn(rows, sum(padded), generator=generator) * 7
    start = 0
    for length in padded:
        real = 0 if rng.random() < 0.25 else rng.randint(1, length)
        values[:, start + real:start + length] = 0
        start += length
    return values > 0 if dtype is torch.bool else values.to(dtype)


def _params(padded: list[int], cp: int):
    from megatron.varlen.packing.packed_seq import varlen_packed_seq_params

    # As MTP sees them: the padded boundaries are its sequence boundaries (mtp.py).
    cu = torch.tensor([0, *padded], dtype=torch.int64).cumsum(0).to(torch.int32)
    return varlen_packed_seq_params(cu, cu, cu, cu, max(padded), cp)


def _check_packs(group, seed: int, num_packs: int) -> int:
    """Compares ours with both references on ``num_packs`` random packs; returns the count."""
    from megatron.core.transformer import multi_token_prediction as mcore_mtp

    from megatron.varlen.model.mtp_roll import packed_roll
    from megatron.varlen.packing.cp_split import get_thd_partition_indices

    cp, rank = group.size(), group.rank()
    rng = random.Random(seed)  # the same packs on every rank
    checked = 0
    for _ in range(num_packs):
        padded = _padded_lengths(rng, cp, rng.randint(1, 24), rng.randint(0, 3))
        params = _params(padded, cp)
        mine = get_thd_partition_indices(params.host_cu_seqlens, cp, rank)
        for dtype in DTYPES:
            for rows in (None, 2):  # [T] and [b, T]
                whole = _pack_values(rng, padded, dtype, rows or 1)
                whole = whole[0] if rows is None else whole
                local = whole.index_select(-1, mine)
                got, got_sum = packed_roll(mcore_mtp.roll_tensor, local, -1, -1, group, params)
                expected, expected_sum = mcore_mtp.roll_tensor(local, -1, -1, group, params)
                unsplit, _ = mcore_mtp.roll_tensor(whole, -1, -1, None, params)
                assert got.dtype == expected.dtype and torch.equal(got, expected), (padded, dtype)
                assert torch.equal(got_sum, expected_sum), (padded, dtype)
                assert torch.equal(got, unsplit.index_select(-1, mine)), (padded, dtype)
                assert torch.equal(local, whole.index_select(-1, mine))  # input untouched
                checked += 1
    return checked


@contextlib.contextmanager
def _counting_communication():
    """Counts this rank's calls of the torch.distributed functions in ``_COMMUNICATION``."""
    calls = {}
    originals = {name: getattr(torch.distributed, name) for name in _COMMUNICATION
                 if hasattr(torch.distributed, name)}  # all_gather_single: torch >= 2.13

    def counted(name, function):
        def call(*args, **kwargs):
            calls[name] = calls.get(name, 0) + 1
            return function(*args, **kwargs)
        return call

    for name, function in originals.items():
        setattr(torch.distributed, name, counted(name, function))
    try:
        yield calls
    finally:
        for name, function in originals.items():
            setattr(torch.distributed, name, function)


def _roll_costs(group, num_sequences: int) -> dict:
    """Operator and communication calls of one roll of a [1, T_r] stream of ``num_sequences``
    equal sequences, ours (after the per-micro-batch build) and megatron-core's."""
    from megatron.core.transformer import multi_token_prediction as mcore_mtp

    from megatron.varlen.model.mtp_roll import packed_roll
    from megatron.varlen.platform.host_syncs import count_dispatches

    params = _params([2 * group.size() * 4] * num_sequences, group.size())
    local = torch.arange(int(params.host_cu_seqlens[-1]) // group.size())[None]
    packed_roll(mcore_mtp.roll_tensor, local, -1, -1, group, params)  # builds the positions
    rolls = {"ours": lambda: packed_roll(mcore_mtp.roll_tensor, local, -1, -1, group, params),
             "megatron-core": lambda: mcore_mtp.roll_tensor(local, -1, -1, group, params)}
    costs = {}
    for name, roll in rolls.items():
        with count_dispatches() as operators, _counting_communication() as communication:
            roll()
        costs[name] = {"operators": sum(operators.values()),
                       "communication": sum(communication.values())}
    return costs


def _rank_main(seed: int, num_packs: int) -> dict:
    group = torch.distributed.new_group(list(range(torch.distributed.get_world_size())))
    checked = _check_packs(group, seed, num_packs)
    return {"checked": checked, "few": _roll_costs(group, 4), "many": _roll_costs(group, 64),
            "rank": group.rank(), "size": group.size()}


@pytest.mark.parametrize("world", [2, 4])
def test_cp_roll_equals_megatron_cores_and_the_unsplit_roll(world):
    results = run_distributed(_rank_main, world, args=(world, 6), timeout_s=240)
    for result in results:
        assert result["checked"] == 6 * len(DTYPES) * 2
        few, many = result["few"], result["many"]
        # Ours: one all-gather and the same operators, whatever the number of sequences.
        assert few["ours"] == many["ours"], result
        assert few["ours"]["communication"] == 1, result
        # megatron-core's: up to 4 point-to-point calls per sequence (2 on the first and last
        # ranks of the group), and operators that grow with the sequences.
        per_sequence = 2 if result["rank"] in (0, result["size"] - 1) else 4
        assert many["megatron-core"]["communication"] == 64 * per_sequence, result
        assert many["megatron-core"]["operators"] > 10 * many["ours"]["operators"], result


def test_where_the_chunks_are_uneven_it_is_megatron_cores():
    from megatron.varlen.model.mtp_roll import packed_roll

    class Group:
        def size(self):
            return 2

        def rank(self):
            return 0

    calls = []

    def original(*args, **kwargs):
        calls.append(kwargs)
        return "original"

    # Boundaries 6 and 10 are not multiples of 2 x cp = 4: megatron-core's halves differ.
    assert packed_roll(original, torch.arange(5), -1, -1, Group(), _params([6, 4], 2)) == "original"
    # A stream the boundaries do not cover (8 tokens per rank, 9 given).
    assert packed_roll(original, torch.arange(9), -1, -1, Group(), _params([8, 8], 2)) == "original"
    assert len(calls) == 2


def _train_counting_rolls(argv: list[str]) -> dict:
    """A training run on this rank, counting MTP rolls by path: ours under CP
    (``_roll_cp``) and megatron-core's loop called with a CP group of several ranks."""
    from megatron.core.transformer import multi_token_prediction as mcore_mtp

    from megatron.varlen.model import mtp_roll
    from tests.harness.training_runs import train_on_this_rank

    counts = {"ours": 0, "megatron-core": 0}
    ours, loop = mtp_roll._roll_cp, mcore_mtp._roll_tensor_packed_seq

    def counted_ours(*args, **kwargs):
        counts["ours"] += 1
        return ours(*args, **kwargs)

    def counted_loop(tensor, shifts, dims, packed_seq_params, cp_group=None):
        if cp_group is not None and cp_group.size() > 1:
            counts["megatron-core"] += 1
        return loop(tensor, shifts, dims, packed_seq_params, cp_group)

    mtp_roll._roll_cp, mcore_mtp._roll_tensor_packed_seq = counted_ours, counted_loop
    try:
        train_on_this_rank(argv)
    finally:
        mtp_roll._roll_cp, mcore_mtp._roll_tensor_packed_seq = ours, loop
    return counts


def test_a_dynamic_cp_mtp_run_rolls_with_one_gather():
    """The training path reaches ``_roll_cp`` (the equivalence of its losses with the unpacked
    run is test_dynamic_cp_equivalence.py's ``mtp_dp2_cp2``): never megatron-core's loop."""
    from tests.unit_tests.varlen_training.test_dynamic_cp_equivalence import DYNAMIC, MTP

    argv = DYNAMIC + MTP + ["--context-parallel-size", "2", "--max-seqlen-per-dp-cp-rank", "16",
                            "--global-batch-size", "8", "--train-iters", "2"]
    counts = run_distributed(_train_counting_rolls, 4, args=(argv,), timeout_s=240)
    assert sum(count["ours"] for count in counts) > 0, counts
    assert all(count["megatron-core"] == 0 for count in counts), counts
