"""Price tables of the lower bounds (bounds.py, bounds_microbatch.py): every sequence at every
size any registered scheduler may give it, from the cost model's array form."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from megatron.varlen.scheduling.pricing import padded_lengths_array
from megatron.varlen.scheduling.problem import ScheduleProblem


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
    padded = padded_lengths_array(lengths, sizes[None, :], problem.sp_factor)
    time = problem.cost.time(padded, sizes)
    feasible = problem.cost.tokens(padded, sizes) <= problem.max_seqlen_per_rank
    time = np.where(feasible, time, np.inf)
    return PriceTable(sizes=sizes, tokens=np.where(feasible, padded, np.iinfo(np.int64).max),
                      time=time, work=time * sizes)


def latency_price_table(problem: ScheduleProblem) -> PriceTable:
    """``price_table`` with the group latency charged (docs/SCHEDULING.md, latency-aware
    bound): time + d (c - 1), the least level of a micro-batch holding the sequence on c ranks,
    and work + P d (c - 1) / M, its least share of its group's latency rank-time (a group's
    sequences hold at most M of its c ranks' tokens each, so P / (c M) of it at least)."""
    table = price_table(problem)
    latency = problem.cost.group_latency(table.sizes).astype(np.float64)
    padded = np.where(np.isfinite(table.time), table.tokens, 0).astype(np.float64)
    share = padded * latency / problem.max_seqlen_per_rank
    return PriceTable(sizes=table.sizes, tokens=table.tokens, time=table.time + latency,
                      work=table.work + share)
