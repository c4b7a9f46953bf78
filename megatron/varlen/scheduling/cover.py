"""Give free ranks work by growing or merging blocks, without slowing the micro-batch.

Only needed when a micro-batch has fewer sequences than it has room for (the last one, or one
made by splitting for the pipeline). Moves, slowest block first:

* grow: a block moves one step up the size chain if the free ranks allow it and its new per-rank
  time does not exceed the micro-batch's level (growing the slowest block lowers the level);
* merge: when no block can grow (a chain step larger than the free ranks, e.g. 2 -> 6), the k
  least-loaded blocks of the smallest size join the free ranks as one block of the next size,
  again only if that block stays within the level. With a divisor chain, k such blocks always
  exist: the smallest-size blocks plus the free ranks fill whole blocks of the next size.

A move is refused if it would raise the level or break the budget (ring latency and padding can
exceed a short sequence's compute, while an idle rank costs the critical path nothing). Levels
only fall and free ranks only shrink, so a refused block is never retried.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush

from megatron.varlen.scheduling.draft import MicrobatchDraft, price_bag
from megatron.varlen.scheduling.pricing import ItemPricing


def _try_grow(draft: MicrobatchDraft, pricing: ItemPricing, block: int, level: float) -> bool:
    """Grows ``block`` one chain step if that fits the free ranks, budget and level."""
    size = draft.sizes[block]
    larger = pricing.next_size(size)
    if larger is None or larger - size > draft.free_ranks:
        return False
    time, tokens = draft.reprice_block(block, larger, pricing)
    if tokens > pricing.budget or time > level:
        return False
    draft.resize_block(block, larger, time, tokens)
    return True


def _grow_blocks(draft: MicrobatchDraft, pricing: ItemPricing) -> None:
    """Grows blocks, slowest first, while free ranks remain and the level does not rise."""
    heap = [(-time, block) for block, time in enumerate(draft.times)]
    heapify(heap)
    level, refused_max = draft.level, 0.0
    while heap and draft.free_ranks > 0:
        negative_time, block = heappop(heap)
        if _try_grow(draft, pricing, block, level):
            heappush(heap, (-draft.times[block], block))
            level = max(refused_max, -heap[0][0])
        else:
            refused_max = max(refused_max, -negative_time)


def merge_smallest(draft: MicrobatchDraft, pricing: ItemPricing, cap: float | None = None) -> bool:
    """Merges the least-loaded smallest blocks with the free ranks into one block of the next
    size, if it stays within ``cap`` (default: the level) and the budget."""
    smallest = min(draft.sizes)
    larger = pricing.next_size(smallest)
    if larger is None:
        return False
    needed = max(1, -(-(larger - draft.free_ranks) // smallest))
    candidates = sorted((time, index) for index, time in enumerate(draft.times)
                        if draft.sizes[index] == smallest)
    assert len(candidates) >= needed, (
        f"chain invariant broken: {len(candidates)} blocks of size {smallest} and "
        f"{draft.free_ranks} free ranks cannot fill a block of {larger}")
    chosen = {index for _, index in candidates[:needed]}
    time, tokens = price_bag([seq for index in sorted(chosen) for seq in draft.members[index]],
                             larger, pricing)
    if tokens > pricing.budget or time > (draft.level if cap is None else cap):
        return False
    draft.merge_blocks(chosen, larger, time, tokens)
    return True


def cover_free_ranks(draft: MicrobatchDraft, pricing: ItemPricing) -> None:
    """Gives free ranks of ``draft`` work where that does not slow it (module docstring)."""
    while draft.free_ranks > 0 and draft.sizes:
        _grow_blocks(draft, pricing)
        if draft.free_ranks == 0 or not merge_smallest(draft, pricing):
            return
