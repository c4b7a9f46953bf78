"""Per-sequence prices (time, tokens, work) under a set of allowed CP sizes.

Vectorised with numpy once per global batch, then handed to the packing loops as plain lists
(scalar list indexing is several times faster than numpy scalar indexing in a Python loop).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from megatron.varlen.scheduling.problem import (
    BUDGET_FLAG,
    CHUNKS_PER_CP_RANK,
    ScheduleProblem,
    padded_length,
)


@dataclass
class ItemPricing:
    """Prices of every sequence of one problem.

    Attributes:
        lengths: Real lengths by id.
        sizes: Ascending CP sizes a sequence may get.
        min_size: Smallest feasible size per id.
        min_time: Per-rank time at min_size per id (without group latency).
        min_tokens: Per-rank padded tokens at min_size per id.
        min_work: min_size * min_time per id: the least rank-time the sequence can cost.
        order: Ids sorted by length descending, then id ascending (the packing order).
        length_array: ``lengths`` as an int64 array (for numpy passes over the batch).
        min_time_array, min_tokens_array: ``min_time`` and ``min_tokens`` as arrays (the
            numpy LPT rounds gather from them).
        order_negated_lengths: ``-lengths[seq]`` for each ``seq`` of ``order`` (from the sort;
            the sequence queue bisects it), or None when not computed.
    """

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
    a: float
    b: float
    g: float
    d: float
    length_array: np.ndarray | None = field(default=None, compare=False, repr=False)
    min_time_array: np.ndarray | None = field(default=None, compare=False, repr=False)
    min_tokens_array: np.ndarray | None = field(default=None, compare=False, repr=False)
    # Not an init field, so a copy with another order (dataclasses.replace) drops it.
    order_negated_lengths: list[int] | None = field(default=None, init=False, compare=False,
                                                    repr=False)

    def time_tokens(self, seq: int, size: int) -> tuple[float, int]:
        """Per-rank (time, padded tokens) of ``seq`` on a group of ``size`` ranks."""
        if size == self.min_size[seq]:
            return self.min_time[seq], self.min_tokens[seq]
        padded = padded_length(self.lengths[seq], size, self.sp_factor)
        time = (self.a * padded * padded + self.b * padded) / size
        if size > 1:
            time += self.g * padded * (size - 1) / size
        return time, padded // size

    def latency(self, size: int) -> float:
        """Per-micro-batch latency of a group of ``size`` ranks."""
        return self.d * (size - 1)

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
    lengths = np.fromiter(problem.lengths, dtype=np.int64, count=problem.num_sequences)
    min_size = _min_feasible_sizes(lengths, sizes, problem.max_seqlen_per_rank,
                                   problem.sp_factor)
    if len(lengths) and min_size.min() == 0:
        _raise_infeasible(problem, lengths[min_size == 0].max(), sizes, flag_hint)
    sp_factor, cost = problem.sp_factor, problem.cost
    multiple = np.where(min_size > 1, CHUNKS_PER_CP_RANK * min_size * sp_factor, sp_factor)
    chunks = -(-lengths // multiple)
    padded = chunks * multiple
    # Per-rank tokens padded // min_size, as the chunks times the multiple's per-rank share
    # (numpy's integer division is slow).
    tokens = chunks * np.where(min_size > 1, CHUNKS_PER_CP_RANK * sp_factor, sp_factor)
    time = (cost.a * padded.astype(np.float64) ** 2 + cost.b * padded) / min_size
    time += np.where(min_size > 1, cost.g * padded * (min_size - 1) / min_size, 0.0)
    order, negated = _packing_order(lengths)
    min_time, min_size_list = time.tolist(), min_size.tolist()
    pricing = ItemPricing(
        lengths=list(problem.lengths), sizes=tuple(sizes), min_size=min_size_list,
        min_time=min_time, min_tokens=tokens.tolist(),
        min_work=_min_work(min_time, min_size_list, min_size), order=order,
        budget=problem.max_seqlen_per_rank,
        num_ranks=problem.num_ranks, sp_factor=sp_factor,
        a=cost.a, b=cost.b, g=cost.g, d=cost.d, length_array=lengths, min_time_array=time,
        min_tokens_array=tokens)
    pricing.order_negated_lengths = negated
    return pricing


def _min_work(min_time: list[float], min_size: list[int], sizes: np.ndarray) -> list[float]:
    """``min_time[seq] * min_size[seq]`` for every sequence. Most sequences need one rank,
    where the product is the time itself (x * 1 == x), so the time list is copied and only
    the sequences on larger groups are multiplied (a float times an int in Python is the
    product numpy gives): cheaper than a numpy product and one more list of new floats."""
    work = list(min_time)
    for seq in np.flatnonzero(sizes > 1).tolist():
        work[seq] = min_time[seq] * min_size[seq]
    return work


def _packing_order(lengths: np.ndarray) -> tuple[list[int], list[int]]:
    """Ids by length descending, then id ascending, and their negated lengths in that order.
    The pair (-length, id) is packed into one int64 (unique keys, so any sort gives this
    order) and sorted without an argsort: about 3x faster than a stable argsort of -lengths,
    which gives the same order."""
    count = len(lengths)
    shift = max(count - 1, 1).bit_length()
    if count == 0 or int(lengths.max()) >= 1 << (62 - shift):  # keys would overflow
        order = np.argsort(-lengths, kind="stable")
        return order.tolist(), (-lengths[order]).tolist()
    keys = np.sort((-lengths << shift) | np.arange(count, dtype=np.int64))
    # -length << shift has zero low bits: the low bits are the id, the high ones -length.
    return (keys & ((1 << shift) - 1)).tolist(), (keys >> shift).tolist()


def _min_feasible_sizes(lengths: np.ndarray, sizes: tuple[int, ...], budget: int,
                        sp_factor: int) -> np.ndarray:
    """Smallest size in ``sizes`` whose per-rank padded tokens fit ``budget`` (0 if none).

    On c > 1 ranks the per-rank tokens are 2*sp*ceil(L / (2*c*sp)), which fits iff
    L <= 2*c*sp*floor(budget / (2*sp)): a threshold per size, so one searchsorted does it."""
    chunk = CHUNKS_PER_CP_RANK * sp_factor
    limits = np.asarray([budget // sp_factor * sp_factor if size == 1
                         else chunk * size * (budget // chunk) for size in sizes], dtype=np.int64)
    # Limits grow with the size (a larger group never holds fewer tokens), except that size 1
    # may allow more than size 2 when the budget is not a multiple of 2*sp: keep it monotone.
    limits = np.maximum.accumulate(limits)
    index = np.searchsorted(limits, lengths, side="left")
    padded_sizes = np.asarray(sizes + (0,), dtype=np.int64)
    return padded_sizes[index]


def _raise_infeasible(problem: ScheduleProblem, length: int, sizes: tuple[int, ...],
                      flag_hint: str) -> None:
    largest = sizes[-1]
    need = padded_length(int(length), largest, problem.sp_factor) // largest
    raise ValueError(
        f"sequence of length {int(length)} needs {need} tokens per rank on the largest allowed "
        f"CP group ({largest} ranks), above the budget {problem.max_seqlen_per_rank} "
        f"(raise {BUDGET_FLAG}{flag_hint})")
