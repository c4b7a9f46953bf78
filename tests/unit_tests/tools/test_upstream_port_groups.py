"""tools/upstream_port's carried modules: idle ranks filled (fill_idle) and Megatron-LM's
scheduler interface over default_dynamic_cp (sample_id_groups)."""

import random
from types import SimpleNamespace

import pytest

from megatron.varlen.scheduling import (
    CostModel,
    Schedule,
    ScheduleProblem,
    critical_path,
    get_scheduler,
    idle_rank_slots,
    validate_schedule,
)
from tools.upstream_port.fill_idle import fill_idle_ranks
from tools.upstream_port.sample_id_groups import (
    check_scheduler_settings,
    cost_model_for,
    megatron_group_sizes,
    schedule_sample_groups,
)


def _hand_schedule(problem: ScheduleProblem, ranks: tuple, cp_sizes: tuple) -> Schedule:
    padded = tuple(-(-length // (2 * size)) * 2 * size if size > 1 else length
                   for length, size in zip(problem.lengths, cp_sizes))
    return Schedule(microbatches=(ranks,), cp_sizes=cp_sizes, padded_lengths=padded)


def test_fill_gives_every_rank_work_and_keeps_the_schedule_valid():
    problem = ScheduleProblem(lengths=(256,) * 6, dp_size=16, cp_size=4,
                              max_seqlen_per_rank=4096)
    schedule = get_scheduler("default_dynamic_cp")(problem)
    assert idle_rank_slots(schedule) > 0  # the case the fill exists for
    filled = fill_idle_ranks(problem, schedule)
    validate_schedule(problem, filled)
    assert idle_rank_slots(filled) == 0
    assert critical_path(problem, filled) >= critical_path(problem, schedule)


def test_fill_leaves_a_schedule_without_idle_ranks_alone():
    problem = ScheduleProblem(lengths=tuple(range(100, 1700, 25)), dp_size=4, cp_size=1,
                              max_seqlen_per_rank=2048)
    schedule = get_scheduler("default_dynamic_cp")(problem)
    assert idle_rank_slots(schedule) == 0
    assert fill_idle_ranks(problem, schedule) is schedule


def test_fill_grows_the_block_after_which_the_microbatch_ends_lowest():
    # Three one-rank blocks and one free rank: growing the slowest lowers the level; growing
    # the quickest (whose new time is least) would leave it.
    problem = ScheduleProblem(lengths=(4000, 1000, 500), dp_size=4, cp_size=1,
                              max_seqlen_per_rank=8192)
    schedule = _hand_schedule(problem, ((0,), (1,), (2,), ()), (1, 1, 1))
    filled = fill_idle_ranks(problem, schedule)
    assert filled.cp_sizes == (2, 1, 1)
    assert filled.microbatches[0] == ((0,), (0,), (1,), (2,))
    assert critical_path(problem, filled) < critical_path(problem, schedule)


def test_fill_borrows_from_other_microbatches_without_changing_their_levels():
    # Micro-batch 0's block of two short sequences is not its slowest: one of them can move
    # onto micro-batch 1's idle ranks, where it stays below that micro-batch's level.
    problem = ScheduleProblem(lengths=(3000, 100, 100, 2000, 2000, 1500), dp_size=4, cp_size=1,
                              max_seqlen_per_rank=8192)
    schedule = Schedule(microbatches=(((0,), (1, 2), (3,), (4,)), ((5,), (), (), ())),
                        cp_sizes=(1,) * 6, padded_lengths=problem.lengths)
    before = critical_path(problem, schedule)
    filled = fill_idle_ranks(problem, schedule)
    validate_schedule(problem, filled)
    assert filled.microbatches[0] == ((0,), (1,), (3,), (4,))
    assert filled.microbatches[1] == ((5,), (5,), (2,), (2,))
    assert critical_path(problem, filled) < before  # the grown block got faster


def test_fill_merges_when_no_block_can_grow():
    # 12 ranks, sizes 1, 2, 4, 12: two 4-blocks and 4 free ranks cannot grow (4 -> 12 needs 8).
    problem = ScheduleProblem(lengths=(8000, 8000), dp_size=6, cp_size=2, max_seqlen_per_rank=2048)
    ranks = ((0,),) * 4 + ((1,),) * 4 + ((),) * 4
    filled = fill_idle_ranks(problem, _hand_schedule(problem, ranks, (4, 4)))
    validate_schedule(problem, filled)
    assert filled.cp_sizes == (12, 12) and filled.microbatches[0] == ((0, 1),) * 12


def test_fill_refuses_an_empty_microbatch():
    problem = ScheduleProblem(lengths=(100,), dp_size=2, cp_size=1, max_seqlen_per_rank=128)
    schedule = Schedule(microbatches=(((0,), ()), ((), ())), cp_sizes=(1,), padded_lengths=(100,))
    with pytest.raises(ValueError, match="micro-batch 1 holds no sequence"):
        fill_idle_ranks(problem, schedule)


def test_megatron_group_sizes_are_what_parallel_state_creates():
    assert megatron_group_sizes(8, 1) == (1, 2, 4, 8)
    assert megatron_group_sizes(12, 1) == (1, 2, 4, 8, 12)
    assert megatron_group_sizes(64, 3) == (4, 8, 16, 32, 64)
    assert megatron_group_sizes(1, 1) == (1,)


@pytest.mark.parametrize(("dp", "cp", "minimum", "match"), [
    (9, 2, 1, r"needs CP groups of \[6\] ranks"),  # 18 ranks: 1, 2, 6, 18
    (4, 3, 1, r"needs CP groups of \[3, 6\] ranks"),
])
def test_settings_without_megatron_groups_are_one_line_errors(dp, cp, minimum, match):
    with pytest.raises(ValueError, match=match):
        check_scheduler_settings(dp, cp, minimum)


def test_settings_with_a_packed_sequence_cap_are_refused():
    with pytest.raises(ValueError, match="thd_max_packed_sequences=8"):
        check_scheduler_settings(4, 2, 1, max_num_seqs=8)
    check_scheduler_settings(6, 2, 1)  # 12 ranks: 1, 2, 4, 12 all exist


def _holders(ranks: list) -> dict:
    counts = {}
    for ids in ranks:
        for sample in ids:
            counts[sample] = counts.get(sample, 0) + 1
    return counts


@pytest.mark.parametrize(("dp", "cp", "vpp"), [(4, 2, None), (6, 2, None), (8, 1, 2)])
def test_sample_id_groups_in_upstreams_format(dp, cp, vpp):
    rng = random.Random(dp * 10 + cp)
    lengths = [rng.randint(16, 3000) for _ in range(40)]
    pairs = [(1000 + index, length) for index, length in enumerate(lengths)]
    groups = schedule_sample_groups(pairs, dp_size=dp, cp_size=cp, max_seqlen_per_rank=1024,
                                    vpp_group_size=vpp)
    num_ranks, allowed = dp * cp, set(megatron_group_sizes(dp * cp, 1))
    seen = []
    for ranks in groups:
        assert len(ranks) == num_ranks and all(ranks)  # every rank packs a sample
        holders = _holders(ranks)
        seen += list(holders)
        for rank, ids in enumerate(ranks):
            size = holders[ids[0]]
            assert size in allowed and all(holders[sample] == size for sample in ids)
            start = rank - rank % size
            assert all(ranks[member] == ids for member in range(start, start + size))
            padded = [-(-lengths[s - 1000] // (2 * size)) * 2 * size if size > 1
                      else lengths[s - 1000] for s in ids]
            assert sum(padded) // size <= 1024
    assert sorted(seen) == [pair[0] for pair in pairs]
    assert len(groups) % (vpp or 1) == 0


def test_sample_id_groups_are_our_schedule_where_no_rank_idles():
    rng = random.Random(3)
    lengths = tuple(rng.randint(64, 4000) for _ in range(256))
    problem = ScheduleProblem(lengths=lengths, dp_size=4, cp_size=2, max_seqlen_per_rank=2048)
    ours = get_scheduler("default_dynamic_cp")(problem)
    assert idle_rank_slots(ours) == 0
    groups = schedule_sample_groups(list(enumerate(lengths)), 4, 2, 2048)
    assert groups == [[list(ids) for ids in ranks] for ranks in ours.microbatches]


def test_cost_model_from_coefficients_or_model_config():
    assert cost_model_for() == CostModel()
    assert cost_model_for(cost_coefficients={"a": 1.0, "b": 0.0, "g": 0.0, "d": 0.0}) \
        == CostModel(a=1.0, b=0.0, g=0.0, d=0.0)
    config = SimpleNamespace(hidden_size=1024, num_attention_heads=16, num_query_groups=4)
    assert cost_model_for(config) == CostModel.for_model(1024, kv_fraction=0.25)
    assert cost_model_for(SimpleNamespace(hidden_size=512, num_attention_heads=8,
                                          num_query_groups=None)) == CostModel.for_model(512)
