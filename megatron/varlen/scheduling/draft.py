"""Working state of a micro-batch under construction and its conversion to a Schedule.

A draft is a list of *blocks*: CP groups given only by size (positions follow at the end, see
groups.py: blocks placed largest first from rank 0 are always aligned). Each block holds a bag
of sequences; every rank of the block holds all of them, split ``size`` ways.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from megatron.varlen.scheduling.pricing import ItemPricing
from megatron.varlen.scheduling.problem import CHUNKS_PER_CP_RANK, Schedule, ScheduleProblem


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
        return sum(len(block) for block in self.members)

    def busy_rank_time(self) -> float:
        """Sum over ranks of their time (idle ranks contribute 0)."""
        return sum(size * time for size, time in zip(self.sizes, self.times))

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
    """Lays blocks out largest first from rank 0 and builds the Schedule."""
    cp_sizes = [0] * problem.num_sequences
    microbatches = [_lay_out(draft, problem.num_ranks, cp_sizes) for draft in drafts]
    return Schedule(microbatches=tuple(microbatches), cp_sizes=tuple(cp_sizes),
                    padded_lengths=padded_lengths(problem, cp_sizes))


def _lay_out(draft: MicrobatchDraft, num_ranks: int,
             cp_sizes: list[int]) -> tuple[tuple[int, ...], ...]:
    """Per-rank id tuples of one draft; records each sequence's CP size in ``cp_sizes``."""
    sizes, start = draft.sizes, 0
    if sizes and max(sizes) == 1:  # the bulk of short-sequence micro-batches: block order
        assert len(sizes) <= num_ranks, f"{len(sizes)} blocks on {num_ranks} ranks"
        for ids in draft.members:
            for seq in ids:
                cp_sizes[seq] = 1
        return tuple([tuple(ids) for ids in draft.members] + [()] * (num_ranks - len(sizes)))
    ranks: list[tuple[int, ...]] = [()] * num_ranks  # immutable entries: sharing is safe
    # Stable sort, so equal sizes keep their block order: deterministic.
    for block in sorted(range(len(sizes)), key=sizes.__getitem__, reverse=True):
        size, ids = sizes[block], tuple(draft.members[block])
        assert start % size == 0, f"block of {size} ranks would start unaligned at {start}"
        if size == 1:
            ranks[start] = ids
        else:
            ranks[start:start + size] = [ids] * size
        for seq in ids:
            cp_sizes[seq] = size
        start += size
    assert start <= num_ranks, f"blocks cover {start} ranks, only {num_ranks} exist"
    return tuple(ranks)


def padded_lengths(problem: ScheduleProblem, cp_sizes: list[int]) -> tuple[int, ...]:
    """Vectorised ``padded_length`` of every sequence for its CP size (0 = unscheduled)."""
    lengths = np.asarray(problem.lengths, dtype=np.int64)
    sizes = np.maximum(np.asarray(cp_sizes, dtype=np.int64), 1)
    multiple = np.where(sizes > 1, CHUNKS_PER_CP_RANK * sizes * problem.sp_factor,
                        problem.sp_factor)
    return tuple((-(-lengths // multiple) * multiple).tolist())
