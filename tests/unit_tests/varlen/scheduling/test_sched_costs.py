"""A schedule evaluated once (schedule_evaluation.ScheduleCosts) gives the numbers the training
step needs, the same as evaluating them one by one: the pipeline order from the given levels,
and the log line's statistics (data_schedule.schedule_stats) as from a fresh ``rank_times``."""

import random

import pytest

from megatron.varlen.packing.data_schedule import PackingConfig, schedule_stats
from megatron.varlen.scheduling import (
    ScheduleProblem,
    critical_path,
    get_scheduler,
    order_for_pipeline,
    rank_times,
)
from megatron.varlen.scheduling.schedule_evaluation import microbatch_levels, schedule_costs
from megatron.varlen.packing.thd_microbatch import DUMMY_SEQUENCE_TOKENS


def _schedules():
    rng = random.Random(9)
    for index in range(40):
        num_ranks = rng.choice([2, 4, 8, 16])
        problem = ScheduleProblem(
            lengths=tuple(rng.randint(1, 4000) for _ in range(rng.randint(1, 8 * num_ranks))),
            dp_size=num_ranks // 2, cp_size=2, max_seqlen_per_rank=2048,
            min_num_microbatches=rng.choice([1, 4]))
        name = ("default_dynamic_cp", "dp_balanced", "empty")[index % 3]
        yield problem, get_scheduler(name)(problem)


def test_costs_match_a_fresh_evaluation():
    for problem, schedule in _schedules():
        costs = schedule_costs(problem, schedule)
        assert list(costs.levels) == microbatch_levels(problem, schedule)
        assert costs.critical_path == critical_path(problem, schedule)
        assert costs.busy_rank_time == sum(sum(row) for row in rank_times(problem, schedule))
        for stages in (2, 4):
            assert order_for_pipeline(schedule, problem, stages, list(costs.levels)) == \
                order_for_pipeline(schedule, problem, stages)


@pytest.mark.parametrize("fixed", [None, 4096])
def test_log_statistics_come_from_the_costs(fixed):
    config = PackingConfig(scheduler="default_dynamic_cp", max_seqlen_per_rank=2048, pad_id=0,
                           fixed_tokens_per_rank=fixed)
    for problem, schedule in _schedules():
        stats = schedule_stats(problem, schedule, config, schedule_costs(problem, schedule))
        times = rank_times(problem, schedule)
        idle = sum(1 for ranks in schedule.microbatches for ids in ranks if not ids)
        slots = sum(schedule.padded_lengths) + idle * DUMMY_SEQUENCE_TOKENS
        if fixed:  # every rank of every micro-batch runs exactly `fixed` token slots
            slots = schedule.num_microbatches() * problem.num_ranks * fixed
        balanced = sum(map(sum, times)) / problem.num_ranks
        assert stats == {
            "real_tokens": sum(problem.lengths),
            "padding_ratio": pytest.approx(1.0 - sum(problem.lengths) / slots),
            "schedule_imbalance": pytest.approx(sum(max(row) for row in times) / balanced)}
