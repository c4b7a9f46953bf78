"""The micro-batch price bound (bounds_microbatch.py; docs/SCHEDULING.md, "Micro-batch price
bound"): never above the exact optimum (tools/schedule_oracle.py) on generated instances of
every cost regime and on shrunk benchmark batches with several micro-batches, strictly above
the previous latency-aware bound on some, and its exact lambda checked by hand."""

import numpy as np
import pytest

from megatron.varlen.scheduling import CostModel, ScheduleProblem
from tools.schedule_oracle import REGIMES, generate_instances, solve_exactly
from tools.scheduling import bounds_microbatch
from tools.scheduling.benchmark import WORKLOADS, make_problem, sample_batches
from tools.scheduling.bounds import latency_aware_lower_bound, pooled_latency_bound

TOLERANCE = 1e-9
INSTANCES_PER_REGIME = 24


def _check_below_optimum(problems: list[ScheduleProblem]) -> None:
    for problem in problems:
        optimum = solve_exactly(problem).critical_path
        bound = bounds_microbatch.microbatch_price_bound(problem)
        assert bound <= optimum * (1 + TOLERANCE), (problem, bound, optimum)


@pytest.mark.parametrize("regime", sorted(REGIMES))
def test_microbatch_bound_below_exact_optimum(regime):
    _check_below_optimum(generate_instances(regime, INSTANCES_PER_REGIME, seed=11))


def test_microbatch_bound_below_optimum_on_shrunk_benchmark_batches():
    """Every workload shrunk to 9 sequences on 4 ranks (same lengths, budget, static CP,
    default cost): several micro-batches. (On instances this small the bound does not beat the
    previous LB3; the benchmark batch below shows where it does.)"""
    problems = []
    for workload in WORKLOADS:
        cp_size = min(workload.cp_size, 4)
        for lengths in sample_batches(workload, 9, 3, seed=7):
            problems.append(ScheduleProblem(lengths=lengths, dp_size=4 // cp_size,
                                            cp_size=cp_size, max_seqlen_per_rank=workload.budget,
                                            cost=CostModel()))
    _check_below_optimum(problems)


def test_tighter_than_previous_bound_on_the_pareto_tail_small_batch():
    """The benchmark's small-batch pareto_tail row (64 ranks, 512 sequences, seed 1), first
    batch: the previous LB3 pools two micro-batches' tokens; the micro-batch price bound is
    2.4% higher (2.9505e8 vs 2.8810e8; an LP solver's optimal prices give 2.9510e8)."""
    workload = next(item for item in WORKLOADS if item.name == "pareto_tail")
    (lengths,) = sample_batches(workload, 8 * 64, 1, seed=1)
    problem = make_problem(workload, lengths, 64, CostModel())
    assert latency_aware_lower_bound(problem) > 1.02 * pooled_latency_bound(problem)


def test_exact_lambda_by_hand():
    """2 ranks (sizes 1, 2), time = padded length / c (b = 1 only), budget 4, lengths 4 and 2,
    prices (4: 2, 2: 1). Options (size: time, tokens, least level): 4 -> c=1: 4, 4, 4; c=2: 2,
    4, 2; 2 -> c=1: 2, 2, 2; c=2: 2, 4, 2. Breakpoints 2 and 4.
    Stretch [2, 4): 4 only on 2 ranks. Time shares (theta = 1): 4 -> 2 * 2 / 2 = 2, 2 -> 2 / 2
    = 1 (c=1); knapsack with capacity 2 at 1 price per share: 2, ratio 2 / 2 = 1. Token shares
    (theta = 0): 1 and 0.5, both fit: 3, ratio 1.5. Stretch [4, inf) (sum y / 1 = 3 is below
    4): shares 1 and 0.5 either way, 3 / 4. So lambda = 1 (the optimum is 4: one micro-batch
    of level 4 or two of level 2; bound 3 / 1 = 3 = the least work / N)."""
    problem = ScheduleProblem(lengths=(4, 2), dp_size=1, cp_size=2, max_seqlen_per_rank=4,
                              cost=CostModel(a=0.0, b=1.0, g=0.0, d=0.0))
    options = bounds_microbatch.length_options(problem)  # lengths sorted: 2, then 4
    prices = np.array([1.0, 2.0])
    assert bounds_microbatch.price_ratio(options, prices) == pytest.approx(1.0, rel=1e-12)
    token_only = bounds_microbatch.Stretches(options, np.array([2.0]), np.array([4.0]))
    assert token_only.ratios(prices, np.zeros((1, 2)), np.array([0]))[0] == pytest.approx(1.5)
    assert solve_exactly(problem).critical_path == pytest.approx(4.0)


def test_latency_narrows_the_room_of_a_group():
    """1 x 2 ranks, only size 2 (min CP 2), time = L / 2, d = 1, budget 8, one sequence of
    length 4 (time 2, least level 3) at price 3: at level 3 its group's ranks have room 3 - 1
    = 2 for time, which it fills, so lambda = 3 / 3 = 1 (the bound is the optimum, 3). Charging
    no latency (room 3) would give a share 2 * 2 / 3 and the knapsack would take it 1.5 times
    (lambda 1.5): the test below pins the room."""
    problem = ScheduleProblem(lengths=(4,), dp_size=1, cp_size=2, min_cp_size=2,
                              max_seqlen_per_rank=8, cost=CostModel(a=0.0, b=1.0, g=0.0, d=1.0))
    options = bounds_microbatch.length_options(problem)
    assert bounds_microbatch.price_ratio(options, np.array([3.0])) == pytest.approx(1.0)
    assert bounds_microbatch.microbatch_price_bound(problem) == pytest.approx(3.0)
    assert solve_exactly(problem).critical_path == pytest.approx(3.0)


def test_large_batches_are_skipped():
    """More than MAX_TOKEN_MICROBATCHES micro-batches by tokens alone: the bound is 0 (LB3
    then comes from the pooled bounds alone)."""
    budget = 64
    count = 2 * (bounds_microbatch.MAX_TOKEN_MICROBATCHES + 1)
    problem = ScheduleProblem(lengths=(budget,) * count, dp_size=2, cp_size=1,
                              max_seqlen_per_rank=budget)
    assert not bounds_microbatch.applies(problem)
    assert bounds_microbatch.microbatch_price_bound(problem) == 0.0
    small = ScheduleProblem(lengths=(budget,) * 4, dp_size=2, cp_size=1, max_seqlen_per_rank=budget)
    assert bounds_microbatch.applies(small)
    assert bounds_microbatch.microbatch_price_bound(small) == pytest.approx(
        2 * CostModel().time(budget, 1))
