"""Phase 2 of a micro-batch: blocks below its level, least loaded first, get the longest
queued sequence (from anywhere in the queue) that fits their time and token room (best fit):
idle time becomes useful work, and the level never rises.
"""

from __future__ import annotations

from megatron.varlen.scheduling.draft import MicrobatchDraft
from megatron.varlen.scheduling.lpt import LeastLoaded
from megatron.varlen.scheduling.pricing import ItemPricing
from megatron.varlen.scheduling.problem import pad_multiple
from megatron.varlen.scheduling.seq_queue import SequenceQueue

# Candidates tried from the longest length that fits by the cost model: its root is a float, so
# rounding may let the first few exceed a room by a hair.
BEST_FIT_PROBES = 3


def best_fit(pricing: ItemPricing, queue: SequenceQueue, size: int, time_room: float,
             token_room: int) -> tuple[int, int, float, int] | None:
    """The longest queued sequence that fits a block of ``size`` ranks within ``time_room``
    and ``token_room``, as (position, sequence, time, tokens), or None. A length fits iff its
    padded length does: the cost model's longest fitting length, rounded down to the padding
    multiple, is where the queue starts looking."""
    multiple = pad_multiple(size, pricing.sp_factor)
    longest = int(pricing.cost.longest_fitting(time_room, token_room, size))
    longest = longest // multiple * multiple
    if longest < 1:
        return None
    pos = queue.longest_at_most(longest)
    for _ in range(BEST_FIT_PROBES):
        if pos >= queue.end:
            return None
        seq = pricing.order[pos]
        if pricing.min_size[seq] <= size:
            time, tokens = pricing.time_tokens(seq, size)
            if time <= time_room and tokens <= token_room:
                return pos, seq, time, tokens
        pos = queue.first(pos + 1)
    return None


def _shortest_time(draft: MicrobatchDraft, pricing: ItemPricing, queue: SequenceQueue) -> float:
    """The least time of the shortest queued sequence on any block size of the draft. Times
    grow with the length and the shortest queued sequence only gets longer as the queue
    shrinks, so a block with less time room can take nothing, now or later."""
    shortest = pricing.order[queue.last()]
    return min(pricing.time_tokens(shortest, size)[0] for size in set(draft.sizes))


def fill_holes(draft: MicrobatchDraft, pricing: ItemPricing, queue: SequenceQueue) -> None:
    """Phase 2 (module docstring). A block that fits nothing now never will (rooms only
    shrink); the phase ends when the most room is below ``_shortest_time``."""
    if not queue.remaining or not draft.sizes:
        return
    level, floor = draft.level, _shortest_time(draft, pricing, queue)
    if level - min(draft.times) < floor:
        return  # no hole: the usual case, without sorting the blocks
    loads = LeastLoaded(zip(draft.times, range(len(draft.times))))
    while loads and queue.remaining:
        top_time, block = loads.pop_least()
        if level - top_time < floor:
            return
        found = best_fit(pricing, queue, draft.sizes[block], level - top_time,
                         pricing.budget - draft.tokens[block])
        if found is None:
            continue
        pos, seq, time, tokens = found
        draft.add(block, seq, time, tokens)
        draft.absorbed_work += pricing.min_work[seq]
        queue.take(pos)
        loads.push((draft.times[block], block))
