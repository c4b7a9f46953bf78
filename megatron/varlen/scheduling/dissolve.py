"""Move sequences out of light micro-batches into the groups of others when that shortens
the batch (run after packing, before the micro-batch count rules).

Packing builds one micro-batch at a time, so it cannot see that sequences left for a later,
light micro-batch would cost less riding in an earlier micro-batch's group: every micro-batch
pays its group latency d (c - 1), and when its few sequences cannot fill the ranks, its level is
far above their work / N. Example (issue 12): DP4xCP2, budget 128, lengths 704, 275, 32: 704
needs all 8 ranks, and 275 and 32 fit in its bag (88 + 36 + 4 = 128 tokens per rank), which
saves a second micro-batch and its 3 d.

Two moves, tried on the lightest micro-batches first:

* *dissolve* micro-batch j: each of its sequences (longest first) joins an existing block of
  another micro-batch (a size at least its minimum, within the token budget), where that
  micro-batch's level rises least; accepted if the rises sum to less than j's level;
* *evict* j's slowest block: the same for that block's sequences only; accepted if the rises
  sum to less than the drop of j's level (to its next slowest block), after which j's freed
  ranks are covered again (cover.py) where that lowers it further.

Both strictly shorten the critical path. A move is planned on a tentative copy of the touched
blocks and applied only if accepted. The pass is bounded: at most MAX_TRIES plans, each moving at
most MAX_SEQUENCES sequences over all blocks, and skipped above MAX_BLOCKS blocks in total (large
batches, whose light tail is a negligible part of their critical path).
"""

from __future__ import annotations

from megatron.varlen.scheduling.cover import cover_free_ranks
from megatron.varlen.scheduling.draft import MicrobatchDraft
from megatron.varlen.scheduling.pricing import ItemPricing

MAX_SEQUENCES = 16
MAX_TRIES = 16
MAX_BLOCKS = 4096
# A move must save more than this fraction of the victim's level (float noise guard).
MIN_RELATIVE_GAIN = 1e-9


def _place(drafts: list[MicrobatchDraft], pricing: ItemPricing, skip: int, seq: int,
           times: dict, tokens: dict, levels: list[float]) -> tuple[float, int, int] | None:
    """Cheapest (level rise, micro-batch, block) for ``seq`` outside micro-batch ``skip``,
    given the tentative block ``times``/``tokens`` and ``levels``; None if nothing fits."""
    best = None
    min_size, budget = pricing.min_size[seq], pricing.budget
    for index, draft in enumerate(drafts):
        if index == skip:
            continue
        level = levels[index]
        for block, size in enumerate(draft.sizes):
            if size < min_size:
                continue
            time, seq_tokens = pricing.time_tokens(seq, size)
            key = (index, block)
            if tokens.get(key, draft.tokens[block]) + seq_tokens > budget:
                continue
            end = times.get(key, draft.times[block]) + time
            candidate = (max(0.0, end - level), index, block)
            if best is None or candidate < best:
                best = candidate
    return best


def _plan(drafts: list[MicrobatchDraft], pricing: ItemPricing, victim: int, seqs: list[int],
          saving: float) -> list[tuple[int, int, int]] | None:
    """(sequence, micro-batch, block) moves of ``seqs`` out of ``victim`` whose level rises sum
    to less than ``saving``, or None."""
    levels = [draft.level for draft in drafts]
    allowance = saving - MIN_RELATIVE_GAIN * drafts[victim].level
    times: dict = {}
    tokens: dict = {}
    moves, rise = [], 0.0
    for seq in sorted(seqs, key=lambda seq: (-pricing.lengths[seq], seq)):
        found = _place(drafts, pricing, victim, seq, times, tokens, levels)
        if found is None:
            return None
        increase, index, block = found
        rise += increase
        if rise >= allowance:
            return None
        time, seq_tokens = pricing.time_tokens(seq, drafts[index].sizes[block])
        key = (index, block)
        times[key] = times.get(key, drafts[index].times[block]) + time
        tokens[key] = tokens.get(key, drafts[index].tokens[block]) + seq_tokens
        levels[index] = max(levels[index], times[key])
        moves.append((seq, index, block))
    return moves


def _apply(drafts: list[MicrobatchDraft], pricing: ItemPricing,
           moves: list[tuple[int, int, int]]) -> None:
    for seq, index, block in moves:
        time, seq_tokens = pricing.time_tokens(seq, drafts[index].sizes[block])
        drafts[index].add(block, seq, time, seq_tokens)


def _remove_block(draft: MicrobatchDraft, block: int) -> None:
    """Drops ``block`` from ``draft``; its ranks become free."""
    draft.free_ranks += draft.sizes[block]
    for column in (draft.sizes, draft.times, draft.tokens, draft.members):
        del column[block]


def _try_victim(drafts: list[MicrobatchDraft], pricing: ItemPricing, victim: int) -> bool:
    """Dissolves or, failing that, evicts the slowest block of ``drafts[victim]``."""
    draft = drafts[victim]
    if draft.num_items <= MAX_SEQUENCES:
        moves = _plan(drafts, pricing, victim, draft.item_ids(), draft.level)
        if moves is not None:
            _apply(drafts, pricing, moves)
            del drafts[victim]
            return True
    if len(draft.sizes) < 2:
        return False
    slowest = max(range(len(draft.sizes)), key=lambda block: (draft.times[block], -block))
    if len(draft.members[slowest]) > MAX_SEQUENCES:
        return False
    rest = max(time for block, time in enumerate(draft.times) if block != slowest)
    moves = _plan(drafts, pricing, victim, list(draft.members[slowest]), draft.level - rest)
    if moves is None:
        return False
    _apply(drafts, pricing, moves)
    _remove_block(draft, slowest)
    cover_free_ranks(draft, pricing)
    return True


def move_out_of_light_microbatches(drafts: list[MicrobatchDraft],
                                   pricing: ItemPricing) -> list[MicrobatchDraft]:
    """Applies dissolve/evict moves (module docstring) while they shorten the critical path."""
    if len(drafts) < 2 or sum(len(draft.sizes) for draft in drafts) > MAX_BLOCKS:
        return drafts
    drafts = list(drafts)
    refused: list[MicrobatchDraft] = []  # failed victims, retried only after a success
    for _ in range(MAX_TRIES):
        candidates = [index for index, draft in enumerate(drafts)
                      if draft.num_items and not any(draft is other for other in refused)]
        if len(drafts) < 2 or not candidates:
            break
        victim = min(candidates, key=lambda index: (drafts[index].level, index))
        if _try_victim(drafts, pricing, victim):
            refused.clear()
        else:
            refused.append(drafts[victim])
    return drafts
