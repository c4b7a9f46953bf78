"""Lower bounds: bound <= brute-force optimum <= achieved, on tiny instances."""

import itertools
import math
import random

import pytest

from megatron.varlen.scheduling import CostModel, ScheduleProblem, critical_path, get_scheduler
from megatron.varlen.scheduling.problem import padded_length
from tools.schedule_oracle import REFERENCE_COST, REGIMES, generate_instances, solve_exactly
from tools.scheduling.bound_prices import bound_sizes
from tools.scheduling.bounds import (
    budget_aware_lower_bound,
    latency_aware_lower_bound,
    simple_lower_bound,
)

TOLERANCE = 1e-9
COSTS = (CostModel(), CostModel(a=1.0, b=0.0, g=0.0, d=0.0), CostModel(a=1.0, b=50.0, g=30.0,
                                                                         d=500.0))


def _block_configs(sizes: tuple[int, ...], num_ranks: int) -> list[tuple[int, ...]]:
    """Every multiset of sizes (non-increasing tuples) with sum <= num_ranks."""
    configs = []
    for count in range(1, num_ranks + 1):
        for combo in itertools.combinations_with_replacement(sorted(sizes, reverse=True), count):
            if sum(combo) <= num_ranks:
                configs.append(combo)
    return configs


def _microbatch_level(problem: ScheduleProblem, members: list[int], config: tuple[int, ...],
                      assignment: tuple[int, ...]) -> float:
    cost, times, tokens = problem.cost, [0.0] * len(config), [0] * len(config)
    used = [False] * len(config)
    for seq, block in zip(members, assignment):
        size = config[block]
        padded = padded_length(problem.lengths[seq], size, problem.sp_factor)
        times[block] += cost.time(padded, size)
        tokens[block] += padded // size
        used[block] = True
    if any(count > problem.max_seqlen_per_rank for count in tokens):
        return math.inf
    return max(time + cost.group_latency(size)
               for time, size, flag in zip(times, config, used) if flag)


def brute_force_optimum(problem: ScheduleProblem, sizes: tuple[int, ...] | None = None) -> float:
    """Minimum critical path over every schedule using ``sizes`` (default: every size any
    scheduler may use) (tiny instances only)."""
    num = problem.num_sequences
    configs = _block_configs(sizes or bound_sizes(problem), problem.num_ranks)
    best_single = {}
    for mask in range(1, 1 << num):
        members = [seq for seq in range(num) if mask >> seq & 1]
        best_single[mask] = min(
            _microbatch_level(problem, members, config, assignment)
            for config in configs
            for assignment in itertools.product(range(len(config)), repeat=len(members)))
    best = {0: 0.0}
    for mask in range(1, 1 << num):
        low = mask & -mask
        rest, options = mask ^ low, []
        sub = rest
        while True:
            options.append(best_single[sub | low] + best[mask ^ (sub | low)])
            if sub == 0:
                break
            sub = (sub - 1) & rest
        best[mask] = min(options)
    return best[(1 << num) - 1]


@pytest.mark.parametrize("seed", range(24))
def test_bounds_below_brute_force_optimum_below_achieved(seed):
    rng = random.Random(seed)
    dp_size, cp_size = rng.choice([(1, 1), (2, 1), (1, 2), (3, 1), (2, 2), (4, 1)])
    budget = rng.choice([16, 32, 64])
    lengths = tuple(rng.randint(1, budget * dp_size * cp_size) for _ in range(rng.randint(1, 4)))
    problem = ScheduleProblem(lengths=lengths, dp_size=dp_size, cp_size=cp_size,
                              max_seqlen_per_rank=budget, cost=rng.choice(COSTS))
    simple, budget_aware = simple_lower_bound(problem), budget_aware_lower_bound(problem)
    latency_aware = latency_aware_lower_bound(problem)
    optimum = brute_force_optimum(problem)
    achieved = critical_path(problem, get_scheduler("default_dynamic_cp")(problem))
    assert simple <= budget_aware * (1 + TOLERANCE)
    assert budget_aware <= latency_aware * (1 + TOLERANCE)
    assert latency_aware <= optimum * (1 + TOLERANCE), (lengths, latency_aware, optimum)
    assert optimum <= achieved * (1 + TOLERANCE)


def test_budget_aware_bound_is_strictly_tighter_when_budget_binds():
    """Three long sequences that fill their ranks' budget and many short ones: at most two
    long ones share a micro-batch, the third's micro-batch cannot be filled by the short ones
    (their tokens run out first), and giving it all 8 ranks costs ring traffic (g). Only the
    budget-aware bound sees this; here the scheduler meets it almost exactly."""
    lengths = (4096,) * 3 + (64,) * 600
    problem = ScheduleProblem(lengths=lengths, dp_size=8, cp_size=1, max_seqlen_per_rank=1024,
                              cost=CostModel(a=1.0, b=0.0, g=2000.0, d=0.0))
    simple, budget_aware = simple_lower_bound(problem), budget_aware_lower_bound(problem)
    achieved = critical_path(problem, get_scheduler("default_dynamic_cp")(problem))
    assert budget_aware > simple * 1.2
    assert budget_aware <= achieved * (1 + TOLERANCE)
    assert achieved <= budget_aware * 1.01


def test_bounds_hold_for_every_scheduler_on_random_batches():
    rng = random.Random(5)
    for _ in range(20):
        cp_size = rng.choice([1, 2, 4])
        budget = rng.choice([512, 2048])
        lengths = tuple(rng.randint(1, budget * cp_size) for _ in range(rng.randint(1, 200)))
        problem = ScheduleProblem(lengths=lengths, dp_size=rng.randint(1, 4), cp_size=cp_size,
                                  max_seqlen_per_rank=budget, cost=rng.choice(COSTS))
        bound = latency_aware_lower_bound(problem)
        for name in ("dp_balanced", "empty", "default_dynamic_cp"):
            achieved = critical_path(problem, get_scheduler(name)(problem))
            assert bound <= achieved * (1 + TOLERANCE), (name, lengths)


@pytest.mark.parametrize("regime", sorted(REGIMES))
def test_latency_aware_bound_below_exact_optimum(regime):
    """On the oracle's generated instances of every cost regime (incl. large d)."""
    for problem in generate_instances(regime, 8, seed=2):
        optimum = solve_exactly(problem).critical_path
        assert latency_aware_lower_bound(problem) <= optimum * (1 + TOLERANCE), problem


def test_latency_aware_bound_sees_group_latency():
    """The latency example (DP4xCP2, lengths 32, 275, 704): 704 tokens need all 8 ranks, so
    every schedule pays 7 d once; the latency-free bounds miss it (d dominates here), the
    latency-aware bound is near the optimum."""
    problem = ScheduleProblem(lengths=(32, 275, 704), dp_size=4, cp_size=2,
                              max_seqlen_per_rank=128, cost=REFERENCE_COST)
    optimum = solve_exactly(problem).critical_path
    assert budget_aware_lower_bound(problem) < 0.2 * optimum
    assert 0.95 * optimum <= latency_aware_lower_bound(problem) <= optimum * (1 + TOLERANCE)
