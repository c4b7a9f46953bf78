"""Working state of a micro-batch under construction and its conversion to a Schedule.

A draft is a list of *blocks*: CP groups given only by size (positions follow at the end, see
groups.py: blocks placed largest first from rank 0 are always aligned). Each block holds a bag
of sequences; every rank of the block holds all of them, split ``size`` ways.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from operator import mul

import numpy as np

from megatron.varlen.scheduling.pricing import ItemPricing
from megatron.varlen.scheduling.problem import (
    CHUNKS_PER_CP_RANK,
    Schedule,
    ScheduleProblem,
    pad_multiple,
)


@dataclass
class MicrobatchDraft:
    """One micro-batch being built.

    Attributes:
        free_ranks: Ranks not yet in any block.
        sizes: Block sizes.
        times: Per-rank time of each block (sequences plus group latency).
        tokens: Per-rank padded tokens of each block.
        members: Sequence ids of each block, in placement order.
        absorbed_work: Sum of the members' minimum work (what they take off the queue).
    """

    free_ranks: int
    absorbed_work: float = 0.0
    sizes: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    members: list[list[int]] = field(default_factory=list)

    @property
    def level(self) -> float:
        """The micro-batch's critical time: its slowest block."""
        return max(self.times, default=0.0)

    @property
    def num_items(self) -> int:
        """Number of sequences in the micro-batch."""
        return sum(map(len, self.members))

    def busy_rank_time(self) -> float:
        """Sum over ranks of their time (idle ranks contribute 0)."""
        return sum(map(mul, self.sizes, self.times))  # in C: the same additions, in order

    def item_ids(self) -> list[int]:
        """All sequence ids in the micro-batch."""
        return [seq for block in self.members for seq in block]

    def open_block(self, seq: int, size: int, time: float, tokens: int) -> int:
        """Opens a block of ``size`` free ranks holding ``seq``; returns its index."""
        assert size <= self.free_ranks, f"block of {size} ranks but only {self.free_ranks} free"
        self.free_ranks -= size
        self.sizes.append(size)
        self.times.append(time)
        self.tokens.append(tokens)
        self.members.append([seq])
        return len(self.sizes) - 1

    def add(self, block: int, seq: int, time: float, tokens: int) -> None:
        """Adds ``seq`` (with its per-rank time and tokens at this block's size) to ``block``."""
        self.times[block] += time
        self.tokens[block] += tokens
        self.members[block].append(seq)

    def reprice_block(self, block: int, size: int, pricing: ItemPricing) -> tuple[float, int]:
        """Per-rank (time, tokens) the block's sequences would have on ``size`` ranks."""
        time, tokens = pricing.latency(size), 0
        for seq in self.members[block]:
            seq_time, seq_tokens = pricing.time_tokens(seq, size)
            time += seq_time
            tokens += seq_tokens
        return time, tokens


def drafts_to_schedule(problem: ScheduleProblem,
                       drafts: list[MicrobatchDraft]) -> Schedule:
    """Lays blocks out largest first from rank 0 and builds the Schedule.

    The schedulers place every sequence in exactly one draft (checked below), so CP sizes
    start at 1 and only the sequences of larger groups are written, padded lengths with them:
    most sequences of a batch run on one rank, and a pass over all of them (or a numpy round
    trip) cost as much as the layout itself."""
    groups: list[tuple[int, list[int]]] = []  # (size, sequences) of groups of > 1 rank
    microbatches = tuple([_lay_out(draft, problem.num_ranks, groups) for draft in drafts])
    placed = sum(sum(map(len, draft.members)) for draft in drafts)
    assert placed == problem.num_sequences, (
        f"{placed} sequences placed, {problem.num_sequences} in the batch: "
        f"each must be placed once")
    cp_sizes, padded = [1] * problem.num_sequences, _one_rank_padded_lengths(problem)
    lengths, sp_factor = problem.lengths, problem.sp_factor
    for size, seqs in groups:
        multiple = pad_multiple(size, sp_factor)  # padded_length, with the rule's one lookup
        for seq in seqs:
            cp_sizes[seq] = size
            padded[seq] = -(-lengths[seq] // multiple) * multiple
    return Schedule(microbatches=microbatches, cp_sizes=tuple(cp_sizes),
                    padded_lengths=tuple(padded))


def _one_rank_padded_lengths(problem: ScheduleProblem) -> list[int]:
    """Every sequence's padded length on one rank (a multiple of the SP factor)."""
    sp_factor = problem.sp_factor
    if sp_factor == 1:
        return list(problem.lengths)
    return [-(-length // sp_factor) * sp_factor for length in problem.lengths]


def _lay_out(draft: MicrobatchDraft, num_ranks: int,
             groups: list[tuple[int, list[int]]]) -> tuple[tuple[int, ...], ...]:
    """Per-rank id tuples of one draft, blocks largest first from rank 0 (a stable sort: equal
    sizes keep their block order, deterministic); appends (size, sequences) of its blocks of
    each size > 1 to ``groups``. Per size, not per block: tuples are repeated onto ranks in C
    (a micro-batch has up to N blocks, and a Python step per block cost more than the rest)."""
    sizes, members = draft.sizes, draft.members
    covered = sum(sizes)
    assert covered <= num_ranks, f"blocks cover {covered} ranks, only {num_ranks} exist"
    idle = ((),) * (num_ranks - covered)
    if not sizes or max(sizes) == 1:  # the bulk of short-sequence micro-batches: block order
        return (*map(tuple, members), *idle)
    by_size = sorted(range(len(sizes)), key=sizes.__getitem__, reverse=True)
    ranks: list[tuple[int, ...]] = []
    for size in sorted(set(sizes), reverse=True):
        assert len(ranks) % size == 0, (
            f"blocks of {size} ranks would start unaligned at {len(ranks)}")
        run = [members[block] for block in by_size[:sizes.count(size)]]
        del by_size[:len(run)]
        # zip of the run's tuples with itself gives each tuple ``size`` times in a row: the
        # same object on every rank of its block (immutable, so sharing is safe).
        ranks += chain.from_iterable(zip(*[list(map(tuple, run))] * size))
        if size > 1:
            groups.append((size, list(chain.from_iterable(run))))
    return (*ranks, *idle)


def padded_lengths(problem: ScheduleProblem, cp_sizes: list[int]) -> tuple[int, ...]:
    """Vectorised ``padded_length`` of every sequence for its CP size (0 = unscheduled)."""
    lengths = np.asarray(problem.lengths, dtype=np.int64)
    sizes = np.maximum(np.asarray(cp_sizes, dtype=np.int64), 1)
    multiple = np.where(sizes > 1, CHUNKS_PER_CP_RANK * sizes * problem.sp_factor,
                        problem.sp_factor)
    return tuple((-(-lengths // multiple) * multiple).tolist())
