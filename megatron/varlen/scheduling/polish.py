"""Polish of small batches: moves that even out each micro-batch's blocks after packing.

Level packing places each sequence once, greedily, so a micro-batch often ends with a few
blocks above the rest. Two kinds of move lower a micro-batch's level (its slowest block), each
applied only when the critical path strictly falls:

* *exchange* (within one micro-batch): while the slowest block is the only one at the level,
  move one of its sequences to another block of the micro-batch or swap it for one of that
  block's, choosing the move that leaves the level lowest. On token-capped micro-batches (short
  sequences filling every rank up to the budget) the greedy cannot even the per-rank time
  ``a sum L^2 + b sum L`` out, because tokens and time are not proportional; swaps can.
* *trim* (into other micro-batches): when several blocks share the top (e.g. the last
  micro-batch: 8 of 64 ranks hold three short sequences, the rest two), no single move helps.
  A trim cuts the level down to a lower block's time: one sequence leaves each block above it
  and rides in another micro-batch's block where that micro-batch's level rises least
  (dissolve.plan_moves); accepted if the rises sum to less than the cut.

The order is exchange, trim, exchange (trims leave new blocks on top): 0.1-1.9% off the critical
path of the benchmark's small batches (8 sequences per rank). It runs only on batches of at most
POLISH_MAX_SEQUENCES_PER_RANK per rank and POLISH_MAX_SEQUENCES in all: larger ones balance well
already (a micro-batch's imbalance telescopes to about one sequence over many micro-batches) and
must keep their latency budget (4,096 sequences on 64 ranks never enter); the limits below bound
the pairs and cuts each micro-batch examines.
"""

from __future__ import annotations

from collections.abc import Iterable

from megatron.varlen.scheduling.dissolve import apply_moves, plan_moves
from megatron.varlen.scheduling.draft import MicrobatchDraft
from megatron.varlen.scheduling.pricing import ItemPricing

# Batches the polish runs on (module docstring): the benchmark's small batches have 8
# sequences per rank, its latency targets 64; the total bounds the scans of all blocks.
POLISH_MAX_SEQUENCES_PER_RANK = 8
POLISH_MAX_SEQUENCES = 2048
# Block pairs an exchange pass examines per block of the micro-batch. Late moves find less and
# look further, so most of the gain comes first (pareto_tail's last micro-batch: 88% of it in
# the first 6% of the pairs an unbounded search looks at).
PAIRS_PER_BLOCK = 2
# Trims: cuts tried per attempt (the largest drops between consecutive block times among the
# TRIM_MAX_BLOCKS slowest blocks), attempts per micro-batch.
TRIM_MAX_BLOCKS = 16
TRIM_CUTS = 3
TRIM_ROUNDS = 4
# A move must lower the level by more than this fraction (float noise guard).
MIN_RELATIVE_GAIN = 1e-9


def polish_applies(num_sequences: int, num_ranks: int) -> bool:
    """Whether a batch is small enough for the polish (module docstring)."""
    return num_sequences <= min(POLISH_MAX_SEQUENCES_PER_RANK * num_ranks, POLISH_MAX_SEQUENCES)


def polish_small_batch(drafts: list[MicrobatchDraft],
                       pricing: ItemPricing) -> list[MicrobatchDraft]:
    """Exchanges, trims, exchanges (module docstring) on a small batch, in place; returns
    ``drafts``. Every move keeps the blocks, their sizes, the budget and the micro-batch
    count, and strictly shortens the critical path."""
    if not polish_applies(len(pricing.lengths), pricing.num_ranks):
        return drafts
    prices = _PriceCache(pricing)
    _exchange(drafts, range(len(drafts)), pricing, prices)
    touched: set[int] = set()  # micro-batches whose blocks trims changed
    for victim in range(len(drafts)):
        for _ in range(TRIM_ROUNDS):
            moved_to = _trim(drafts, pricing, prices, victim)
            if moved_to is None:
                break
            touched.update(moved_to, (victim,))
    _exchange(drafts, sorted(touched), pricing, prices)
    return drafts


class _PriceCache(dict):
    """(sequence, size) -> per-rank (time, tokens), computed once per polish."""

    def __init__(self, pricing: ItemPricing):
        super().__init__()
        self.pricing = pricing

    def __missing__(self, key: tuple[int, int]) -> tuple[float, int]:
        value = self[key] = self.pricing.time_tokens(*key)
        return value


def _exchange(drafts: list[MicrobatchDraft], indices: Iterable[int], pricing: ItemPricing,
              prices: _PriceCache) -> None:
    """Exchange moves in ``drafts[index]`` for each of ``indices``."""
    for index in indices:
        draft = drafts[index]
        budget = PAIRS_PER_BLOCK * len(draft.sizes)
        while budget > 0:  # each move strictly lowers the level and spends at least one pair
            moved, examined = _exchange_once(draft, pricing, prices, budget)
            budget -= examined
            if not moved:
                break


def _exchange_once(draft: MicrobatchDraft, pricing: ItemPricing, prices: _PriceCache,
                   budget: int) -> tuple[bool, int]:
    """Applies the move out of the slowest block that leaves the level lowest among the first
    ``budget`` block pairs examined; returns (whether a move lowered the level, pairs
    examined). No move when the level is shared by two blocks: no single move can lower it."""
    times, sizes = draft.times, draft.sizes
    if len(times) < 2:
        return False, 0
    ranked = sorted(range(len(times)), key=times.__getitem__, reverse=True)
    slowest = ranked[0]
    level, second = times[slowest], times[ranked[1]]
    third = times[ranked[2]] if len(ranked) > 2 else 0.0
    if second >= level * (1.0 - MIN_RELATIVE_GAIN):
        return False, 0
    best_level, best_move, examined = level * (1.0 - MIN_RELATIVE_GAIN), None, 0
    for other in ranked[:0:-1]:  # least loaded first: the most room
        if examined >= budget:
            break
        rest = third if other == ranked[1] else second
        same_size = sizes[other] == sizes[slowest]
        # Between blocks of one size a move keeps the pair's total time, so the pair's
        # slower block ends at least halfway between them.
        if rest >= best_level or (same_size and (level + times[other]) / 2 >= best_level):
            continue
        examined += 1
        found = _best_pair_move(draft, pricing, prices, slowest, other, rest, best_level)
        if found is not None:
            best_level, best_move = found
            if best_level <= second:
                break  # the least any move can reach, short of the second block's own moves
    if best_move is None:
        return False, examined
    target, seq, partner = best_move
    _move(draft, prices, seq, slowest, target)
    if partner is not None:
        _move(draft, prices, partner, target, slowest)
    return True, examined


def _best_pair_move(draft: MicrobatchDraft, pricing: ItemPricing, prices: _PriceCache,
                    source: int, target: int, rest: float,
                    bound: float) -> tuple[float, tuple[int, int, int | None]] | None:
    """(level, (target, seq, partner or None)) of the best relocation of a ``source``
    sequence to ``target``, or swap with one of its sequences, whose level is below
    ``bound``; None if there is none. ``rest`` is the level of the other blocks."""
    sizes, times, tokens, budget = draft.sizes, draft.times, draft.tokens, pricing.budget
    source_size, target_size = sizes[source], sizes[target]
    min_size = pricing.min_size
    partners = [(partner, *prices[partner, target_size], *prices[partner, source_size])
                for partner in draft.members[target] if min_size[partner] <= source_size]
    can_relocate = len(draft.members[source]) > 1  # blocks never empty
    best = None
    for seq in draft.members[source]:
        if min_size[seq] > target_size:
            continue
        out_time, out_tokens = prices[seq, source_size]
        in_time, in_tokens = prices[seq, target_size]
        source_time, source_tokens = times[source] - out_time, tokens[source] - out_tokens
        target_time, target_tokens = times[target] + in_time, tokens[target] + in_tokens
        if can_relocate and target_tokens <= budget:
            new_level = source_time if source_time > target_time else target_time
            if new_level < rest:
                new_level = rest
            if new_level < bound:
                bound, best = new_level, (new_level, (target, seq, None))
        for partner, time_there, tokens_there, time_here, tokens_here in partners:
            new_source, new_target = source_time + time_here, target_time - time_there
            new_level = new_source if new_source > new_target else new_target
            if new_level < rest:
                new_level = rest
            if (new_level < bound and target_tokens - tokens_there <= budget
                    and source_tokens + tokens_here <= budget):
                bound, best = new_level, (new_level, (target, seq, partner))
    return best


def _move(draft: MicrobatchDraft, prices: _PriceCache, seq: int, source: int,
          target: int) -> None:
    _take_out(draft, prices, seq, source)
    time, tokens = prices[seq, draft.sizes[target]]
    draft.add(target, seq, time, tokens)


def _take_out(draft: MicrobatchDraft, prices: _PriceCache, seq: int, block: int) -> None:
    draft.remove(block, seq, *prices[seq, draft.sizes[block]])


def _trim(drafts: list[MicrobatchDraft], pricing: ItemPricing, prices: _PriceCache,
          victim: int) -> list[int] | None:
    """Cuts ``drafts[victim]``'s level down to a lower block's time (module docstring): tries
    the TRIM_CUTS largest drops among its TRIM_MAX_BLOCKS slowest blocks, smallest cut first,
    and applies the first that shortens the critical path. Returns the micro-batches the
    sequences moved to, or None if no cut does."""
    draft = drafts[victim]
    times = draft.times
    ranked = sorted(range(len(times)), key=lambda block: (-times[block], block))
    deepest = min(TRIM_MAX_BLOCKS, len(ranked) - 1)
    cuts = sorted(range(1, deepest + 1),
                  key=lambda cut: (times[ranked[cut]] - times[ranked[cut - 1]], cut))
    for cut in sorted(cuts[:TRIM_CUTS]):
        level = times[ranked[cut]]
        leaving = _leaving(draft, prices, ranked[:cut], level)
        if leaving is None:
            continue
        moves = plan_moves(drafts, pricing, (victim, None), [seq for _, seq in leaving], level)
        if moves is None:
            continue
        apply_moves(drafts, pricing, moves)
        for block, seq in leaving:
            _take_out(draft, prices, seq, block)
        return [index for _, index, _ in moves]
    return None


def _leaving(draft: MicrobatchDraft, prices: _PriceCache, blocks: list[int],
             level: float) -> list[tuple[int, int]] | None:
    """(block, sequence) per block: its quickest sequence whose leaving brings the block down
    to ``level``; None if a block has none (or only one sequence: blocks never empty)."""
    leaving = []
    for block in blocks:
        members, size = draft.members[block], draft.sizes[block]
        excess = draft.times[block] - level
        fitting = [(prices[seq, size][0], seq) for seq in members
                   if len(members) > 1 and prices[seq, size][0] >= excess]
        if not fitting:
            return None
        leaving.append((block, min(fitting)[1]))
    return leaving
