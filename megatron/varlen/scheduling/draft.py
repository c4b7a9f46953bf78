"""A micro-batch under construction and its conversion to a Schedule.

A draft is a list of *blocks*: CP groups given only by size (positions follow at the end: blocks
placed largest first from rank 0 are aligned, see groups.py), each holding a bag of sequences
split ``size`` ways. Blocks change only through the methods here, so their columns agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import mul

from megatron.varlen.scheduling.pricing import ItemPricing, padded_lengths_array
from megatron.varlen.scheduling.problem import Schedule, ScheduleProblem


def price_bag(seqs: list[int], size: int, pricing: ItemPricing) -> tuple[float, int]:
    """Per-rank (time with the group latency, tokens) of a block of ``size`` ranks holding
    ``seqs`` (times added in order)."""
    time, tokens = pricing.latency(size), 0
    for seq in seqs:
        seq_time, seq_tokens = pricing.time_tokens(seq, size)
        time += seq_time
        tokens += seq_tokens
    return time, tokens


@dataclass
class MicrobatchDraft:
    """One micro-batch being built: ranks in no block yet, and per block its size, per-rank
    time (sequences plus group latency), per-rank padded tokens and members (in placement
    order); absorbed_work sums the members' minimum work (what they take off the queue)."""

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
        return sum(map(mul, self.sizes, self.times))

    def item_ids(self) -> list[int]:
        """All sequence ids in the micro-batch."""
        return [seq for block in self.members for seq in block]

    def open_block(self, seq: int, size: int, time: float, tokens: int) -> int:
        """Opens a block of ``size`` free ranks holding ``seq`` (``time`` includes the group
        latency); returns its index."""
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

    def remove(self, block: int, seq: int, time: float, tokens: int) -> None:
        """Takes ``seq`` (priced at this block's size) out of ``block``."""
        self.members[block].remove(seq)
        self.times[block] -= time
        self.tokens[block] -= tokens

    def reprice_block(self, block: int, size: int, pricing: ItemPricing) -> tuple[float, int]:
        """Per-rank (time, tokens) the block's sequences would have on ``size`` ranks."""
        return price_bag(self.members[block], size, pricing)

    def resize_block(self, block: int, size: int, time: float, tokens: int) -> None:
        """Moves ``block`` onto ``size`` ranks (the difference from or to the free ranks)."""
        assert size - self.sizes[block] <= self.free_ranks, "not enough free ranks to grow"
        self.free_ranks -= size - self.sizes[block]
        self.sizes[block], self.times[block], self.tokens[block] = size, time, tokens

    def merge_blocks(self, blocks: set[int], size: int, time: float, tokens: int) -> None:
        """Replaces ``blocks`` by one block of ``size`` ranks (the last one) holding their
        sequences in block order, priced ``time`` and ``tokens``."""
        merged = [seq for block in sorted(blocks) for seq in self.members[block]]
        for block in sorted(blocks, reverse=True):
            self.remove_block(block)
        self.open_block(merged[0], size, time, tokens)
        self.members[-1] = merged

    def remove_block(self, block: int) -> None:
        """Drops ``block`` and its sequences; its ranks become free."""
        self.free_ranks += self.sizes[block]
        for column in (self.sizes, self.times, self.tokens, self.members):
            del column[block]


def drafts_to_schedule(problem: ScheduleProblem, drafts: list[MicrobatchDraft]) -> Schedule:
    """Lays each draft's blocks out largest first from rank 0 and builds the Schedule."""
    cp_sizes = [0] * problem.num_sequences
    for draft in drafts:
        for size, members in zip(draft.sizes, draft.members):
            for seq in members:
                cp_sizes[seq] = size
    placed = sum(draft.num_items for draft in drafts)
    assert placed == problem.num_sequences and 0 not in cp_sizes, (
        f"{placed} placements for {problem.num_sequences} sequences: each must be placed once")
    padded = padded_lengths_array(problem.lengths, cp_sizes, problem.sp_factor)
    return Schedule(microbatches=tuple(_lay_out(draft, problem.num_ranks) for draft in drafts),
                    cp_sizes=tuple(cp_sizes), padded_lengths=tuple(padded.tolist()))


def _lay_out(draft: MicrobatchDraft, num_ranks: int) -> tuple[tuple[int, ...], ...]:
    """Per-rank id tuples of one draft: blocks largest first from rank 0 (a stable sort, so
    blocks of one size keep their order), then idle ranks."""
    ranks: list[tuple[int, ...]] = []
    for block in sorted(range(len(draft.sizes)), key=draft.sizes.__getitem__, reverse=True):
        ranks += [tuple(draft.members[block])] * draft.sizes[block]
    assert len(ranks) <= num_ranks, f"blocks cover {len(ranks)} ranks, only {num_ranks} exist"
    return (*ranks, *[()] * (num_ranks - len(ranks)))

