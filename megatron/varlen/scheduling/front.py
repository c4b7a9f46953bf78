"""Phase 1 of a micro-batch: blocks, then LPT, from the front of the queue (longest first).

Each sequence opens a block of its size while enough ranks are free; then each goes to the
block (of a size >= its own) where it ends lowest: LPT. The phase stops at the first sequence
no block can take within the token budget, or that would raise the level other than by plain
LPT (``_should_stop``). Sorted order keeps micro-batches homogeneous, so ranks fill evenly.
"""

from __future__ import annotations

from megatron.varlen.scheduling.draft import MicrobatchDraft
from megatron.varlen.scheduling.lpt import LeastLoaded
from megatron.varlen.scheduling.pricing import ItemPricing
from megatron.varlen.scheduling.seq_queue import SequenceQueue

# Work a sequence may add (relative) by riding on a larger group than it needs while that
# raises the level; beyond it the ring traffic costs more than the balance it buys.
STACKING_WORK_SLACK = 0.05


def size_under_cap(pricing: ItemPricing, seq: int, cap: float | None) -> int:
    """A sequence's size: its minimum, or under a growth cap (growth.py) the smallest allowed
    size whose block time (with the group latency) stays <= cap (the largest if none does)."""
    size = pricing.min_size[seq]
    if cap is None:
        return size
    for candidate in pricing.sizes:
        if candidate >= size:
            size = candidate
            if pricing.time_tokens(seq, size)[0] + pricing.latency(size) <= cap:
                break
    return size


def fill_front(draft: MicrobatchDraft, pricing: ItemPricing, queue: SequenceQueue,
               cap: float | None = None) -> None:
    """Phase 1 (module docstring): opens blocks, then LPT, taking sequences off ``queue``."""
    pos = _open_blocks(draft, pricing, queue, cap)
    loads = {size: LeastLoaded((time, block) for block, time in enumerate(draft.times)
                               if draft.sizes[block] == size) for size in set(draft.sizes)}
    level, end = draft.level, queue.end
    while pos < end:
        seq = pricing.order[pos]
        best = _best_block(draft, pricing, loads, seq, size_under_cap(pricing, seq, cap))
        if best is None:
            return
        end_time, block, time, tokens = best
        if end_time > level:
            if _should_stop(draft, pricing, loads, seq, best):
                return
            level = end_time
        draft.add(block, seq, time, tokens)
        draft.absorbed_work += pricing.min_work[seq]
        load = loads[draft.sizes[block]]
        load.pop_least()
        load.push((draft.times[block], block))
        queue.take(pos)
        pos = queue.first(pos + 1)


def _open_blocks(draft: MicrobatchDraft, pricing: ItemPricing, queue: SequenceQueue,
                 cap: float | None) -> int:
    """Each front sequence opens its own block while enough ranks are free; returns the
    position of the first that did not."""
    pos = queue.first()
    while pos < queue.end:
        seq = pricing.order[pos]
        size = size_under_cap(pricing, seq, cap)
        if size > draft.free_ranks:
            break
        time, tokens = pricing.time_tokens(seq, size)
        draft.open_block(seq, size, time + pricing.latency(size), tokens)
        draft.absorbed_work += pricing.min_work[seq]
        queue.take(pos)
        pos = queue.first(pos + 1)
    return pos


def _best_block(draft: MicrobatchDraft, pricing: ItemPricing, loads: dict[int, LeastLoaded],
                seq: int, min_size: int) -> tuple[float, int, float, int] | None:
    """Among the least-loaded block of each size >= min_size that has token room, the one
    where ``seq`` would end lowest: (end time, block, seq time, seq tokens), or None."""
    best = None
    for size, load in loads.items():
        if size < min_size:
            continue
        top_time, block = load.least()
        time, tokens = pricing.time_tokens(seq, size)
        if draft.tokens[block] + tokens > pricing.budget:
            continue
        candidate = (top_time + time, block, time, tokens)
        if best is None or candidate < best:
            best = candidate
    return best


def _should_stop(draft: MicrobatchDraft, pricing: ItemPricing, loads: dict[int, LeastLoaded],
                 seq: int, best: tuple[float, int, float, int]) -> bool:
    """For a placement that raises the level, True if it is not plain LPT: the least-loaded
    block has no token room (going on would leave the budget-capped blocks idle longer), or the
    block is larger than the sequence needs and the extra ring traffic costs more than
    STACKING_WORK_SLACK of its work (such traffic is only worth paying inside idle time)."""
    block, time = best[1], best[2]
    least_loaded = min(load.least()[0] for load in loads.values())
    if draft.times[block] > least_loaded:
        return True
    extra_work = draft.sizes[block] * time - pricing.min_work[seq]
    return extra_work > STACKING_WORK_SLACK * pricing.min_work[seq]
