"""The group latency bound (docs/SCHEDULING.md, "Group latency bound"): never above the exact
optimum (tools/schedule_oracle.py) on generated instances of every cost regime and on shrunk
benchmark-workload instances, never below the token-share latency-aware bound, and strictly
tighter on a hand-solved instance."""

import math

import pytest

from megatron.varlen.scheduling import CostModel, ScheduleProblem
from tools.schedule_oracle import REGIMES, generate_instances, solve_exactly
from tools.scheduling.benchmark import WORKLOADS, sample_batches
from tools.scheduling.bound_prices import latency_price_table
from tools.scheduling.bounds import (
    budget_aware_lower_bound,
    group_latency_bound,
    latency_aware_lower_bound,
)
from tools.scheduling.bounds_budget import budget_aware_bound

TOLERANCE = 1e-9
INSTANCES_PER_REGIME = 40
SHRUNK_RANKS, SHRUNK_SEQUENCES, SHRUNK_INSTANCES = 8, 8, 8
OLD_BOUND_INSTANCES = 4


def _token_share_bound(problem: ScheduleProblem) -> float:
    """The latency-aware bound as it was before the group latency bound: LB1 and LB2 on the
    token-share prices, and LB2 itself."""
    table = latency_price_table(problem)
    simple = max(table.work.min(axis=1).sum() / problem.num_ranks, table.time.min(axis=1).max())
    budget = budget_aware_bound(table.tokens, table.time, table.work, problem.num_ranks,
                                problem.max_seqlen_per_rank)
    return max(simple, budget, budget_aware_lower_bound(problem))


def _shrunk_workload_instances() -> list[ScheduleProblem]:
    """A few batches of every benchmark workload, shrunk to oracle size (as in
    tools/oracle_gap_shrunk.py): same lengths distribution, budget, static CP, default cost."""
    problems = []
    for workload in WORKLOADS:
        cp_size = min(workload.cp_size, SHRUNK_RANKS)
        for lengths in sample_batches(workload, SHRUNK_SEQUENCES, SHRUNK_INSTANCES, seed=7):
            problems.append(ScheduleProblem(lengths=lengths, dp_size=SHRUNK_RANKS // cp_size,
                                            cp_size=cp_size,
                                            max_seqlen_per_rank=workload.budget,
                                            cost=CostModel()))
    return problems


def _check_below_optimum(problems: list[ScheduleProblem]) -> int:
    """Asserts bound <= optimum on each problem; returns on how many the bound is above the
    token-share prices' own simple bound (max(total least work / N, slowest sequence)), so
    that a test can check that the new charge bites at all."""
    tighter = 0
    for problem in problems:
        optimum = solve_exactly(problem).critical_path
        bound = group_latency_bound(problem)
        assert bound <= optimum * (1 + TOLERANCE), (problem, bound, optimum)
        table = latency_price_table(problem)
        simple = max(table.work.min(axis=1).sum() / problem.num_ranks,
                     table.time.min(axis=1).max())
        tighter += bound > simple * (1 + 1e-6)
    return tighter


@pytest.mark.parametrize("regime", sorted(REGIMES))
def test_group_latency_bound_below_exact_optimum(regime):
    tighter = _check_below_optimum(generate_instances(regime, INSTANCES_PER_REGIME, seed=3))
    if regime != "attention_only":  # d = 0 there: no latency to charge
        assert tighter > 0, f"the bound never bit in {regime}: the test would not see a bug"


def test_group_latency_bound_below_optimum_on_shrunk_benchmark_batches():
    assert _check_below_optimum(_shrunk_workload_instances()) > 0


@pytest.mark.parametrize("regime", sorted(REGIMES))
def test_latency_aware_bound_is_at_least_the_old_one_and_below_the_optimum(regime):
    """latency_aware_lower_bound = max(old token-share bound, group latency bound) (the full
    bounds take about 0.1 s on these tiny instances, so fewer of them)."""
    for problem in generate_instances(regime, OLD_BOUND_INSTANCES, seed=4):
        optimum = solve_exactly(problem).critical_path
        bound = latency_aware_lower_bound(problem)
        assert bound >= _token_share_bound(problem) * (1 - TOLERANCE)
        assert bound >= group_latency_bound(problem) * (1 - TOLERANCE)
        assert bound <= optimum * (1 + TOLERANCE), (problem, bound, optimum)


def test_hand_solved_instance_is_strictly_tighter():
    """2 ranks (sizes 1, 2), attention only (t = L^2 / c) plus group latency d = 8, budget 64,
    lengths 8, 4, 4. By hand: 8 on one rank takes 64; on both ranks 32 + 8 = 40. The optimum is
    56: either (8 on both ranks, 4 and 4 in its bag: 32 + 8 + 8 + 8) or (8 on both ranks) +
    (4 and 4 one per rank: 16). Old bound 48.5: below level 40 the 8 cannot run, so some
    micro-batch lasts A >= 40 and holds it on both ranks at work 64 plus its token share
    2 * 8 * 8 / (2 * 64) = 1 of the latency; its 2 A rank-time absorbs 2 A - 65 of the 4s'
    work 32 and the rest adds (97 - 2 A) / 2: A + 48.5 - A = 48.5 at any A.
    New: below C = 64 the 8 must use both ranks, and its time 32 fills 32 / (C - 8) of the
    group's rank time, so it pays 64 + 16 * 32 / (C - 8); the 4s stay on one rank (16 each):
    f(C) = 48 + 256 / (C - 8), whose fixed point solves (C - 48)(C - 8) = 256:
    C = 28 + sqrt(656) = 53.61."""
    problem = ScheduleProblem(lengths=(8, 4, 4), dp_size=1, cp_size=2, max_seqlen_per_rank=64,
                              cost=CostModel(a=1.0, b=0.0, g=0.0, d=8.0))
    assert solve_exactly(problem).critical_path == pytest.approx(56.0)
    assert _token_share_bound(problem) == pytest.approx(48.5)
    assert group_latency_bound(problem) == pytest.approx(28.0 + math.sqrt(656.0), rel=1e-8)
    assert latency_aware_lower_bound(problem) == pytest.approx(28.0 + math.sqrt(656.0), rel=1e-8)


def test_empty_problem_has_zero_bound():
    problem = ScheduleProblem(lengths=(), dp_size=2, cp_size=1, max_seqlen_per_rank=64)
    assert group_latency_bound(problem) == 0.0


def test_bag_full_in_time_and_tokens_is_charged_its_latency_once():
    """2 ranks, only size 2 (min CP 2), attention only, d = 100, budget 16, lengths 16, 4, 4,
    4, 4. By hand the optimum is one bag of all five: 256 / 2 + 4 * 16 / 2 + 100 = 260 with 8 +
    4 * 2 = 16 tokens per rank (two micro-batches pay 2 d = 200 of latency alone). The group is
    full in tokens and, at C = 260, in time: f(C) = (320 + 200 * 160 / (C - 100)) / 2 has its
    fixed point at exactly 260. The shares must add up linearly: charging each sequence the
    larger of its time share and its token share (16's 0.8 by time, each 4's 0.125 by tokens)
    would charge this group 1.3 times its latency, above the optimum."""
    problem = ScheduleProblem(lengths=(16, 4, 4, 4, 4), dp_size=1, cp_size=2, min_cp_size=2,
                              max_seqlen_per_rank=16, cost=CostModel(a=1.0, b=0.0, g=0.0, d=100.0))
    assert solve_exactly(problem).critical_path == pytest.approx(260.0)
    assert group_latency_bound(problem) == pytest.approx(260.0, rel=1e-8)
    assert group_latency_bound(problem) <= 260.0 * (1 + TOLERANCE)
