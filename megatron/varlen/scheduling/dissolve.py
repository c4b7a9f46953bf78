"""Move sequences out of light micro-batches into the groups of others when that shortens
the batch (after packing, before the micro-batch count rules).

Packing builds one micro-batch at a time, so it cannot see that sequences left for a light
later one would cost less riding in an earlier one's group: every micro-batch pays its group
latency, and few sequences cannot fill its ranks. Example (test_sched_optimality.py): DP4xCP2,
budget 128, lengths 704, 275, 32 all fit in one 8-rank bag (88 + 36 + 4 = 128 tokens per rank).

Two moves, tried on the lightest micro-batches first:

* *dissolve* micro-batch j: each of its sequences (longest first) joins an existing block of
  another micro-batch (a size at least its minimum, within the token budget), where that
  micro-batch's level rises least; accepted if the rises sum to less than j's level;
* *evict* j's slowest block: the same for that block's sequences only; accepted if the rises
  sum to less than the drop of j's level (to its next slowest block), after which j's freed
  ranks are covered again (cover.py) where that lowers it further; failing that, evict only
  the block's longest sequence (a long sequence that should ride a longer one's group, while
  its short companions stay).

Both strictly shorten the critical path; a move is planned on tentative block prices and
applied only if accepted. At most MAX_TRIES plans of at most MAX_SEQUENCES sequences each; none
above MAX_BLOCKS blocks (large batches, whose light tail is a negligible part of their path).
"""

from __future__ import annotations

from megatron.varlen.scheduling.counts import pricing_for_subset
from megatron.varlen.scheduling.cover import cover_free_ranks
from megatron.varlen.scheduling.draft import MicrobatchDraft
from megatron.varlen.scheduling.packing import pack_sequences
from megatron.varlen.scheduling.pricing import ItemPricing

MAX_SEQUENCES = 16
MAX_TRIES = 12
MAX_BLOCKS = 128  # tiny and small batches; a 512-sequence batch on 8 ranks has ~500
# A move must save more than this fraction of the victim's level (float noise guard).
MIN_RELATIVE_GAIN = 1e-9


def _place(drafts: list[MicrobatchDraft], pricing: ItemPricing, skip: tuple[int, int | None],
           seq: int, times: dict, tokens: dict,
           levels: list[float]) -> tuple[float, int, int] | None:
    """Cheapest (level rise, micro-batch, block) for ``seq`` outside ``skip`` (a micro-batch
    and one of its blocks, or None for all of them), given the tentative block
    ``times``/``tokens`` and ``levels``; None if nothing fits."""
    best = None
    prices = {size: pricing.time_tokens(seq, size)
              for size in pricing.sizes if size >= pricing.min_size[seq]}
    budget = pricing.budget
    for index, draft in enumerate(drafts):
        if index == skip[0] and skip[1] is None:
            continue
        level = levels[index]
        for block, size in enumerate(draft.sizes):
            price = prices.get(size)
            if price is None or (index, block) == skip:
                continue
            key = (index, block)
            if tokens.get(key, draft.tokens[block]) + price[1] > budget:
                continue
            candidate = (max(0.0, times.get(key, draft.times[block]) + price[0] - level),
                         index, block)
            if best is None or candidate < best:
                best = candidate
    return best


def plan_moves(drafts: list[MicrobatchDraft], pricing: ItemPricing,
               skip: tuple[int, int | None], seqs: list[int],
               baseline: float) -> list[tuple[int, int, int]] | None:
    """(sequence, micro-batch, block) moves of ``seqs`` out of ``skip`` (a micro-batch and its
    block, or None for the whole micro-batch) that shorten the critical path, or None.

    ``baseline`` is the victim micro-batch's level once ``seqs`` have left (0 if it empties).
    Moves may land in the victim's other blocks; every level rise above the baselines counts,
    and their sum must stay below the saving ``level - baseline``."""
    victim = skip[0]
    levels = [draft.level for draft in drafts]
    allowance = levels[victim] - baseline - MIN_RELATIVE_GAIN * levels[victim]
    levels[victim] = baseline
    times: dict = {}
    tokens: dict = {}
    moves, rise = [], 0.0
    for seq in sorted(seqs, key=lambda seq: (-pricing.lengths[seq], seq)):
        found = _place(drafts, pricing, skip, seq, times, tokens, levels)
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


def apply_moves(drafts: list[MicrobatchDraft], pricing: ItemPricing,
                moves: list[tuple[int, int, int]]) -> None:
    """Adds each planned (sequence, micro-batch, block) move's sequence to its block (the
    caller takes the sequences out of their old blocks)."""
    for seq, index, block in moves:
        time, seq_tokens = pricing.time_tokens(seq, drafts[index].sizes[block])
        drafts[index].add(block, seq, time, seq_tokens)


def _try_victim(drafts: list[MicrobatchDraft], pricing: ItemPricing, victim: int) -> bool:
    """Dissolves or, failing that, evicts the slowest block of ``drafts[victim]``."""
    draft = drafts[victim]
    if draft.num_items <= MAX_SEQUENCES:
        moves = plan_moves(drafts, pricing, (victim, None), draft.item_ids(), 0.0)
        if moves is not None:
            apply_moves(drafts, pricing, moves)
            del drafts[victim]
            return True
    slowest = max(range(len(draft.sizes)), key=lambda block: (draft.times[block], -block))
    members = draft.members[slowest]
    rest = max((time for block, time in enumerate(draft.times) if block != slowest),
               default=0.0)
    if len(draft.sizes) > 1 and len(members) <= MAX_SEQUENCES:
        moves = plan_moves(drafts, pricing, (victim, slowest), list(members), rest)
        if moves is not None:
            apply_moves(drafts, pricing, moves)
            draft.remove_block(slowest)
            cover_free_ranks(draft, pricing)
            return True
    if len(members) < 2 and 1 < draft.num_items <= MAX_SEQUENCES:
        return _evict_longest_and_rebuild(drafts, pricing, victim, members[0])
    if len(members) < 2:
        return False
    return _evict_longest(drafts, pricing, victim, slowest, rest)


def _evict_longest(drafts: list[MicrobatchDraft], pricing: ItemPricing, victim: int,
                   slowest: int, rest: float) -> bool:
    """Moves the longest sequence of the victim's slowest block out; the block stays."""
    draft = drafts[victim]
    members = draft.members[slowest]
    longest = min(members, key=lambda seq: (-pricing.lengths[seq], seq))
    time, seq_tokens = pricing.time_tokens(longest, draft.sizes[slowest])
    if draft.num_items <= MAX_SEQUENCES and _evict_longest_and_rebuild(drafts, pricing, victim,
                                                                      longest):
        return True
    moves = plan_moves(drafts, pricing, (victim, slowest), [longest],
                       max(rest, draft.times[slowest] - time))
    if moves is None:
        return False
    apply_moves(drafts, pricing, moves)
    draft.remove(slowest, longest, time, seq_tokens)
    return True


def _evict_longest_and_rebuild(drafts: list[MicrobatchDraft], pricing: ItemPricing,
                               victim: int, seq: int) -> bool:
    """Moves ``seq`` out of the victim and packs the victim's other sequences afresh (their
    groups may change completely once the long one is gone)."""
    others = [other for other in drafts[victim].item_ids() if other != seq]
    # Cheap necessary condition first: the rebuilt rest takes at least its slowest sequence's
    # fastest time, which must leave room for seq's rise elsewhere.
    floor = max(min(pricing.time_tokens(other, size)[0] for size in pricing.sizes
                    if size >= pricing.min_size[other]) for other in others)
    if plan_moves(drafts, pricing, (victim, None), [seq], floor) is None:
        return False
    rebuilt = pack_sequences(pricing_for_subset(pricing, others), allow_growth=True)
    moves = plan_moves(drafts, pricing, (victim, None), [seq],
                       sum(draft.level for draft in rebuilt))
    if moves is None:
        return False
    apply_moves(drafts, pricing, moves)
    drafts[victim:victim + 1] = rebuilt
    return True


def move_out_of_light_microbatches(drafts: list[MicrobatchDraft],
                                   pricing: ItemPricing) -> list[MicrobatchDraft]:
    """Applies dissolve/evict moves (module docstring) while they shorten the critical path.

    Victims are tried lightest first; after a success the order is recomputed (levels moved),
    after a failure the next lightest is tried. MAX_TRIES attempts in all."""
    if len(drafts) < 2 or sum(len(draft.sizes) for draft in drafts) > MAX_BLOCKS:
        return drafts
    drafts = list(drafts)
    tries, position, order = 0, 0, None
    while tries < MAX_TRIES and len(drafts) > 1:
        if order is None:
            order = sorted((draft.level, index) for index, draft in enumerate(drafts)
                           if draft.sizes)
            position = 0
        if position >= len(order):
            break
        victim = order[position][1]
        tries += 1
        if _try_victim(drafts, pricing, victim):
            order = None
        else:
            position += 1
    return drafts
