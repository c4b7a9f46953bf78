"""The exact oracle (tools/schedule_oracle.py): checked against brute force and hand-solved
cases, so that it can serve as the reference for the scheduler's gap and the bounds."""

import random

import pytest

from megatron.varlen.scheduling import CostModel, ScheduleProblem, critical_path, validate_schedule
from megatron.varlen.scheduling.problem import padded_length
from tests.unit_tests.varlen.scheduling.test_sched_bounds import COSTS, brute_force_optimum
from tools.schedule_oracle import REFERENCE_COST, REGIMES, generate_instances, solve_exactly

TOLERANCE = 1e-9
ATTENTION_ONLY = CostModel(a=1.0, b=0.0, g=0.0, d=0.0)


def _check_result(problem: ScheduleProblem):
    result = solve_exactly(problem)
    validate_schedule(problem, result.schedule, problem.layout)
    assert critical_path(problem, result.schedule) == pytest.approx(result.critical_path,
                                                                    rel=TOLERANCE)
    return result.critical_path


@pytest.mark.parametrize("seed", range(40))
def test_oracle_equals_brute_force(seed):
    """Brute force enumerates every block configuration and assignment per subset, then every
    set partition; the oracle is a different (pruned DP) search over the same space."""
    rng = random.Random(seed)
    dp_size, cp_size = rng.choice([(1, 1), (2, 1), (1, 2), (3, 1), (2, 2), (4, 1)])
    budget = rng.choice([16, 32, 64])
    lengths = tuple(rng.randint(1, budget * dp_size * cp_size) for _ in range(rng.randint(1, 4)))
    min_cp = rng.choice([1, 1, 2])
    problem = ScheduleProblem(lengths=lengths, dp_size=dp_size, cp_size=cp_size,
                              max_seqlen_per_rank=budget,
                              min_cp_size=min(min_cp, dp_size * cp_size),
                              cost=rng.choice(COSTS + (REFERENCE_COST,)))
    expected = brute_force_optimum(problem, problem.layout.sequence_sizes)
    assert _check_result(problem) == pytest.approx(expected, rel=TOLERANCE)


def test_attention_only_optimum_is_total_work_over_ranks():
    """With g = d = 0 the work a * L^2 does not depend on the group size, so the optimum is
    total work / N, reached by giving every sequence all N ranks (bags within the budget)."""
    lengths = (512, 64, 64, 64, 256, 128)  # multiples of 2N = 16: no padding on 8 ranks
    problem = ScheduleProblem(lengths=lengths, dp_size=8, cp_size=1, max_seqlen_per_rank=512,
                              cost=ATTENTION_ONLY)
    assert _check_result(problem) == pytest.approx(sum(n * n for n in lengths) / 8)


def test_single_sequence_gets_its_fastest_group():
    problem = ScheduleProblem(lengths=(512,), dp_size=8, cp_size=1, max_seqlen_per_rank=512,
                              cost=ATTENTION_ONLY)
    assert _check_result(problem) == pytest.approx(512 * 512 / 8)


def test_issue_latency_case_shares_one_group():
    """DP4xCP2, budget 128, lengths 32, 275, 704: 704 needs all 8 ranks, so its
    micro-batch pays 7 d; the others ride in the same bag (88 + 36 + 4 = 128 tokens per
    rank), which beats any second micro-batch (it would pay at least 3 d for 275)."""
    lengths = (32, 275, 704)
    problem = ScheduleProblem(lengths=lengths, dp_size=4, cp_size=2, max_seqlen_per_rank=128,
                              cost=REFERENCE_COST)
    cost = REFERENCE_COST
    expected = sum(cost.time(padded_length(n, 8), 8) for n in lengths) + 7 * cost.d
    assert _check_result(problem) == pytest.approx(expected)


def test_min_cp_size_is_honoured():
    problem = ScheduleProblem(lengths=(10, 20, 30), dp_size=4, cp_size=1, max_seqlen_per_rank=64,
                              min_cp_size=2, cost=REFERENCE_COST)
    result = solve_exactly(problem)
    assert min(result.schedule.cp_sizes) >= 2
    validate_schedule(problem, result.schedule, problem.layout)


@pytest.mark.parametrize("regime", sorted(REGIMES))
def test_generated_instances_solve_to_valid_schedules(regime):
    for problem in generate_instances(regime, 10, seed=1):
        _check_result(problem)


def test_oracle_refuses_large_or_pipelined_problems():
    with pytest.raises(ValueError, match="at most"):
        solve_exactly(ScheduleProblem(lengths=(1,) * 13, dp_size=2, cp_size=1,
                                      max_seqlen_per_rank=64))
    with pytest.raises(ValueError, match="min_num_microbatches"):
        solve_exactly(ScheduleProblem(lengths=(1, 2), dp_size=2, cp_size=1,
                                      max_seqlen_per_rank=64, min_num_microbatches=2))
