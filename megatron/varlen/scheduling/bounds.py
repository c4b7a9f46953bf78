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
  its token share P / (c M) of its group's latency rank-time c d (c - 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from megatron.varlen.scheduling.bounds_budget import budget_aware_bound
from megatron.varlen.scheduling.problem import CHUNKS_PER_CP_RANK, ScheduleProblem


@dataclass(frozen=True)
class PriceTable:
    """Per sequence x allowed size: total tokens, per-rank time, total work (inf if the size
    breaks the budget). Rows are sequences, columns ``sizes``."""

    sizes: np.ndarray
    tokens: np.ndarray
    time: np.ndarray
    work: np.ndarray


def bound_sizes(problem: ScheduleProblem) -> tuple[int, ...]:
    """Sizes any registered scheduler may give a sequence."""
    return tuple(sorted(set(problem.layout.sequence_sizes) | {problem.cp_size}))


def price_table(problem: ScheduleProblem) -> PriceTable:
    """Vectorised prices of every sequence at every size of ``bound_sizes``."""
    sizes = np.asarray(bound_sizes(problem), dtype=np.int64)
    lengths = np.asarray(problem.lengths, dtype=np.int64)[:, None]
    multiple = np.where(sizes > 1, CHUNKS_PER_CP_RANK * sizes * problem.sp_factor,
                        problem.sp_factor)[None, :]
    padded = -(-lengths // multiple) * multiple
    cost = problem.cost
    padded_f = padded.astype(np.float64)
    time = (cost.a * padded_f ** 2 + cost.b * padded_f) / sizes
    time += np.where(sizes > 1, cost.g * padded_f * (sizes - 1) / sizes, 0.0)
    feasible = padded // sizes <= problem.max_seqlen_per_rank
    time = np.where(feasible, time, np.inf)
    return PriceTable(sizes=sizes, tokens=np.where(feasible, padded, np.iinfo(np.int64).max),
                      time=time, work=time * sizes)


def simple_lower_bound(problem: ScheduleProblem) -> float:
    """max(total minimum work / N, longest minimum per-rank time)."""
    if not problem.lengths:
        return 0.0
    table = price_table(problem)
    work_bound = table.work.min(axis=1).sum() / problem.num_ranks
    sequence_bound = table.time.min(axis=1).max()
    return float(max(work_bound, sequence_bound))


def latency_price_table(problem: ScheduleProblem) -> PriceTable:
    """``price_table`` with the group latency charged (docs/SCHEDULING.md, latency-aware
    bound): time + d (c - 1), the least level of a micro-batch holding the sequence on c ranks,
    and work + P d (c - 1) / M, its least share of its group's latency rank-time (a group's
    sequences hold at most M of its c ranks' tokens each, so P / (c M) of it at least)."""
    table = price_table(problem)
    latency = problem.cost.d * (table.sizes - 1).astype(np.float64)
    padded = np.where(np.isfinite(table.time), table.tokens, 0).astype(np.float64)
    share = padded * latency / problem.max_seqlen_per_rank
    return PriceTable(sizes=table.sizes, tokens=table.tokens, time=table.time + latency,
                      work=table.work + share)


def latency_aware_lower_bound(problem: ScheduleProblem) -> float:
    """Both bounds on latency-charged prices (>= budget_aware_lower_bound)."""
    if not problem.lengths:
        return 0.0
    table = latency_price_table(problem)
    simple = max(table.work.min(axis=1).sum() / problem.num_ranks, table.time.min(axis=1).max())
    budget_bound = budget_aware_bound(table.tokens, table.time, table.work,
                                      problem.num_ranks, problem.max_seqlen_per_rank)
    return float(max(simple, budget_bound, budget_aware_lower_bound(problem)))


def budget_aware_lower_bound(problem: ScheduleProblem) -> float:
    """The token-budget-aware bound (>= simple_lower_bound); see bounds_budget.py."""
    if not problem.lengths:
        return 0.0
    table = price_table(problem)
    budget_bound = budget_aware_bound(table.tokens, table.time, table.work,
                                      problem.num_ranks, problem.max_seqlen_per_rank)
    return float(max(simple_lower_bound(problem), budget_bound))
