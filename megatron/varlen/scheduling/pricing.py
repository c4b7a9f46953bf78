"""Per-sequence prices (time, tokens, work) under a set of allowed CP sizes.

Computed with numpy once per global batch (the cost model's array form), then handed to the
packing loops as plain lists: they index one sequence at a time, where a list is several times
faster than a numpy array.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from megatron.varlen.scheduling.cost_model import CostModel
from megatron.varlen.scheduling.problem import (
    BUDGET_FLAG,
    CHUNKS_PER_CP_RANK,
    ScheduleProblem,
    padded_length,
)


def padded_lengths_array(lengths, cp_sizes, sp_factor: int) -> np.ndarray:
    """``padded_length`` of every length for its CP size (an array or one size for all)."""
    lengths, cp_sizes = np.asarray(lengths, dtype=np.int64), np.asarray(cp_sizes)
    multiple = np.where(cp_sizes > 1, CHUNKS_PER_CP_RANK * cp_sizes * sp_factor, sp_factor)
    return -(-lengths // multiple) * multiple


@dataclass
class ItemPricing:
    """Prices of every sequence of one problem, by id: real length, smallest feasible size
    among the ascending allowed ``sizes``, per-rank time (without group latency) and tokens at
    it, and min_work = min_size * min_time (the least rank-time the sequence can cost); the
    packing ``order`` (length descending, then id); the problem's budget, ranks, SP factor and
    the cost model every price comes from."""

    lengths: list[int]
    sizes: tuple[int, ...]
    min_size: list[int]
    min_time: list[float]
    min_tokens: list[int]
    min_work: list[float]
    order: list[int]
    budget: int
    num_ranks: int
    sp_factor: int
    cost: CostModel

    def time_tokens(self, seq: int, size: int) -> tuple[float, int]:
        """Per-rank (time, padded tokens) of ``seq`` on a group of ``size`` ranks."""
        if size == self.min_size[seq]:
            return self.min_time[seq], self.min_tokens[seq]
        padded = padded_length(self.lengths[seq], size, self.sp_factor)
        return self.cost.time(padded, size), self.cost.tokens(padded, size)

    def latency(self, size: int) -> float:
        """Per-micro-batch latency of a group of ``size`` ranks."""
        return self.cost.group_latency(size)

    def next_size(self, size: int) -> int | None:
        """The next larger allowed size, or None at the top."""
        for candidate in self.sizes:
            if candidate > size:
                return candidate
        return None


def price_items(problem: ScheduleProblem, sizes: tuple[int, ...], flag_hint: str) -> ItemPricing:
    """Prices every sequence for the allowed ``sizes``.

    Raises:
        ValueError: if a sequence fits no allowed size within the budget.
    """
    lengths = np.asarray(problem.lengths, dtype=np.int64)
    cost, sp_factor = problem.cost, problem.sp_factor
    min_size = _min_feasible_sizes(problem, lengths, sizes)
    if len(lengths) and min_size.min() == 0:
        _raise_infeasible(problem, lengths[min_size == 0].max(), sizes, flag_hint)
    padded = padded_lengths_array(lengths, min_size, sp_factor)
    time = cost.time(padded, min_size)
    return ItemPricing(
        lengths=list(problem.lengths), sizes=tuple(sizes), min_size=min_size.tolist(),
        min_time=time.tolist(), min_tokens=cost.tokens(padded, min_size).tolist(),
        min_work=(time * min_size).tolist(),
        order=np.argsort(-lengths, kind="stable").tolist(),
        budget=problem.max_seqlen_per_rank, num_ranks=problem.num_ranks, sp_factor=sp_factor,
        cost=cost)


def _min_feasible_sizes(problem: ScheduleProblem, lengths: np.ndarray,
                        sizes: tuple[int, ...]) -> np.ndarray:
    """Smallest size in ``sizes`` (ascending) whose per-rank padded tokens fit the budget, per
    sequence (0 if none)."""
    min_size = np.zeros(len(lengths), dtype=np.int64)
    for size in sizes:
        padded = padded_lengths_array(lengths, size, problem.sp_factor)
        fits = problem.cost.tokens(padded, size) <= problem.max_seqlen_per_rank
        min_size[(min_size == 0) & fits] = size
    return min_size


def _raise_infeasible(problem: ScheduleProblem, length: int, sizes: tuple[int, ...],
                      flag_hint: str) -> None:
    largest = sizes[-1]
    need = padded_length(int(length), largest, problem.sp_factor) // largest
    raise ValueError(
        f"sequence of length {int(length)} needs {need} tokens per rank on the largest allowed "
        f"CP group ({largest} ranks), above the budget {problem.max_seqlen_per_rank} "
        f"(raise {BUDGET_FLAG}{flag_hint})")
