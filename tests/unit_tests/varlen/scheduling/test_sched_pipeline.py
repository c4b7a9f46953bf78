"""1F1B bubble estimate and micro-batch ordering."""

import random

import pytest

from megatron.varlen.scheduling import (
    ScheduleProblem,
    get_scheduler,
    order_for_pipeline,
    validate_schedule,
)
from megatron.varlen.scheduling.schedule_evaluation import microbatch_levels
from tools.scheduling.pipeline_bubbles import pipeline_bubble_estimate


@pytest.mark.parametrize("stages, count", [(1, 4), (2, 2), (4, 8), (4, 3), (8, 32)])
def test_uniform_microbatches_match_textbook_bubble(stages, count):
    estimate = pipeline_bubble_estimate([3.0] * count, stages)
    assert estimate.bubble_fraction == pytest.approx(estimate.uniform_fraction)
    assert estimate.uniform_fraction == pytest.approx((stages - 1) / (count + stages - 1))


def test_cheap_ends_shrink_the_bubble():
    levels = [1.0, 10.0, 10.0, 10.0, 10.0, 1.0]
    spiky_ends = pipeline_bubble_estimate([10.0, 1.0, 10.0, 10.0, 1.0, 10.0], 4)
    assert pipeline_bubble_estimate(levels, 4).makespan < spiky_ends.makespan


def test_order_for_pipeline_is_a_permutation_and_never_slower():
    rng = random.Random(4)
    for _ in range(20):
        lengths = tuple(rng.randint(10, 6000) for _ in range(rng.randint(4, 120)))
        problem = ScheduleProblem(lengths=lengths, dp_size=4, cp_size=2, max_seqlen_per_rank=2048,
                                  min_num_microbatches=4, vpp_group_size=2)
        schedule = get_scheduler("default_dynamic_cp")(problem)
        ordered = order_for_pipeline(schedule, problem, 4)
        validate_schedule(problem, ordered)
        assert sorted(map(repr, ordered.microbatches)) == sorted(map(repr, schedule.microbatches))
        before = pipeline_bubble_estimate(microbatch_levels(problem, schedule), 4).makespan
        after = pipeline_bubble_estimate(microbatch_levels(problem, ordered), 4).makespan
        assert after <= before * (1 + 1e-12)


def test_bad_stage_count():
    with pytest.raises(ValueError, match="--pipeline-model-parallel-size"):
        pipeline_bubble_estimate([1.0], 0)
