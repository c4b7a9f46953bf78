"""Lower bounds on the critical path of any schedule of a problem (docs/SCHEDULING.md).

Both bounds hold for every scheduler in the registry: a sequence may use any size of the
dynamic layout that is >= its minimum (``problem.layout.sequence_sizes``) or the static cp_size,
as long as its padded tokens per rank fit the budget. The first two leave group latency d out;
the third charges it.

* ``simple_lower_bound``: max(sum_i min_c w_i(c) / N, max_i min_c t_i(c)), w = c * t.
* ``budget_aware_lower_bound``: also uses the token budget: a micro-batch holds at most N*M
  padded tokens, so a long sequence's micro-batch can be kept busy only by other sequences that
  fit in the remaining tokens; see bounds_budget.py for the derivation.
* ``latency_aware_lower_bound``: both bounds on prices that include the group latency: a
  sequence on c > 1 ranks makes its micro-batch last at least t + d (c - 1), and costs at least
  its token share P / (c M) of its group's latency rank-time c d (c - 1); and the larger
  ``group_latency_bound``, which also charges a time share t / (C - d (c - 1)) of it, C being
  the critical path itself (a fixed point); and, on small batches, the micro-batch price bound
  of bounds_microbatch.py (prices that no one micro-batch can hold more of than lambda x its
  level).
"""

from __future__ import annotations

import numpy as np

from megatron.varlen.scheduling.problem import ScheduleProblem
from tools.scheduling.bound_prices import latency_price_table, price_table
from tools.scheduling.bounds_budget import budget_aware_bound
from tools.scheduling.bounds_microbatch import microbatch_price_bound


def simple_lower_bound(problem: ScheduleProblem) -> float:
    """max(total minimum work / N, longest minimum per-rank time)."""
    if not problem.lengths:
        return 0.0
    table = price_table(problem)
    work_bound = table.work.min(axis=1).sum() / problem.num_ranks
    sequence_bound = table.time.min(axis=1).max()
    return float(max(work_bound, sequence_bound))


def latency_aware_lower_bound(problem: ScheduleProblem) -> float:
    """The pooled latency-aware bounds and the micro-batch price bound (bounds_microbatch.py;
    small batches only) (>= budget_aware_lower_bound)."""
    if not problem.lengths:
        return 0.0
    return max(pooled_latency_bound(problem), microbatch_price_bound(problem))


def pooled_latency_bound(problem: ScheduleProblem) -> float:
    """Both bounds on latency-charged prices and the group latency bound: the latency-aware
    bounds that pool every micro-batch's tokens and rank-time (>= budget_aware_lower_bound)."""
    if not problem.lengths:
        return 0.0
    table = latency_price_table(problem)
    simple = max(table.work.min(axis=1).sum() / problem.num_ranks, table.time.min(axis=1).max())
    budget_bound = budget_aware_bound(table.tokens, table.time, table.work,
                                      problem.num_ranks, problem.max_seqlen_per_rank)
    return float(max(simple, budget_bound, budget_aware_lower_bound(problem),
                     group_latency_bound(problem)))


# Weights alpha of the time share in a sequence's share of its group's latency (1 - alpha:
# the token share). Any alpha in [0, 1] gives a valid bound; the best differs per batch.
TIME_SHARE_WEIGHTS = (1.0, 0.5)
FIXED_POINT_STEPS = 32  # bisection halvings of [low, f(low)]: 2^-32 of its width


class _GroupLatencyWork:
    """Least work of each sequence when every micro-batch level is at most ``level``:
    min over sizes c with t + d (c - 1) <= level of c t + c d (c - 1) (alpha t / (level -
    d (c - 1)) + (1 - alpha) P / (c M)) -- the work plus a share of its group's latency
    rank-time that the sequences of any one group never exceed in sum (docs/SCHEDULING.md)."""

    def __init__(self, problem: ScheduleProblem):
        table = price_table(problem)
        self.time, self.work = table.time, table.work
        self.latency = problem.cost.group_latency(table.sizes).astype(np.float64)
        self.group_latency = table.sizes * self.latency  # rank-time c d (c - 1)
        padded = np.where(np.isfinite(table.time), table.tokens, 0).astype(np.float64)
        self.token_share = padded / (table.sizes * problem.max_seqlen_per_rank)
        self.slowest = (self.time + self.latency).min(axis=1).max()

    def total(self, level: float, alpha: float) -> float:
        """Sum over sequences of their least work at ``level``."""
        room = level - self.latency
        # room <= 0 only where the size does not fit the level (then masked) or t = 0;
        # infinite times (sizes over the budget) are masked below as well.
        time_share = np.divide(self.time, room, out=np.zeros_like(self.time),
                               where=(room > 0) & np.isfinite(self.time))
        share = alpha * time_share + (1.0 - alpha) * self.token_share
        work = np.where(self.time + self.latency <= level,
                        self.work + self.group_latency * share, np.inf)
        return float(work.min(axis=1).sum())


def group_latency_bound(problem: ScheduleProblem) -> float:
    """The largest C with C <= f(C) (f: total least work at level C / N, non-increasing),
    and at least the slowest sequence's fastest latency-charged time. Every schedule's
    critical path C* satisfies C* >= f(C*), so C* >= any such C (docs/SCHEDULING.md)."""
    if not problem.lengths:
        return 0.0
    prices = _GroupLatencyWork(problem)
    num_ranks, best = problem.num_ranks, float(prices.slowest)
    for alpha in TIME_SHARE_WEIGHTS:
        low = prices.slowest
        high = prices.total(low, alpha) / num_ranks
        if high < low:
            continue  # f(C) <= f(low) < low <= C for every C >= low: nothing above low
        for _ in range(FIXED_POINT_STEPS):  # invariant: low <= f(low), f(C) < C above high
            middle = 0.5 * (low + high)
            if prices.total(middle, alpha) / num_ranks >= middle:
                low = middle
            else:
                high = middle
        best = max(best, low)
    return best


def budget_aware_lower_bound(problem: ScheduleProblem) -> float:
    """The token-budget-aware bound (>= simple_lower_bound); see bounds_budget.py."""
    if not problem.lengths:
        return 0.0
    table = price_table(problem)
    budget_bound = budget_aware_bound(table.tokens, table.time, table.work,
                                      problem.num_ranks, problem.max_seqlen_per_rank)
    return float(max(simple_lower_bound(problem), budget_bound))
