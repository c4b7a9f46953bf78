"""Level packing, shared by dp_balanced and default_dynamic_cp: sequences longest first, one
micro-batch at a time (growth.py: front, holes, cover, growth variants; docs/SCHEDULING.md).
"""

from __future__ import annotations

from megatron.varlen.scheduling.draft import MicrobatchDraft
from megatron.varlen.scheduling.growth import build_microbatch, build_with_growth
from megatron.varlen.scheduling.pricing import ItemPricing
from megatron.varlen.scheduling.seq_queue import SequenceQueue

# The tail, where packing also tries every group size for a micro-batch's first sequence:
# this many sequences per rank left, clamped to [MIN, MAX].
FULL_GROWTH_SEARCH_PER_RANK = 2
FULL_GROWTH_SEARCH_MIN = 32
FULL_GROWTH_SEARCH_MAX = 256  # keeps the second tail packing cheap at 1,024 ranks


def _pack_all(pricing: ItemPricing, queue: SequenceQueue, every_size: bool,
              stop_at: int = 0) -> tuple[list[MicrobatchDraft], SequenceQueue]:
    """Micro-batches with growth until at most ``stop_at`` sequences are queued."""
    drafts = []
    while queue.remaining > stop_at:
        draft, queue = build_with_growth(pricing, queue, every_size)
        drafts.append(draft)
    return drafts, queue


def pack_sequences(pricing: ItemPricing, allow_growth: bool) -> list[MicrobatchDraft]:
    """Packs every sequence of ``pricing.order`` into micro-batches.

    With growth, the *tail* (the last max(min(2N, 256), 32) sequences: the end of a batch, or
    all of a small one) is packed twice, with the fast growth policy and with the full search
    over every size, and the one with the shorter critical path is kept: the full search fixes
    the attention-heavy and few-sequence cases (test_sched_growth.py), while the greedy excess
    rule it relies on can lose a little elsewhere, so neither is ever worse than the other."""
    queue = SequenceQueue(pricing.order, pricing.lengths)
    if not allow_growth:
        drafts = []
        while queue.remaining:
            drafts.append(build_microbatch(pricing, queue))
        return drafts
    tail = max(min(FULL_GROWTH_SEARCH_PER_RANK * pricing.num_ranks, FULL_GROWTH_SEARCH_MAX),
               FULL_GROWTH_SEARCH_MIN)
    drafts, queue = _pack_all(pricing, queue, every_size=False, stop_at=tail)
    fast, _ = _pack_all(pricing, queue.copy(), every_size=False)
    full, _ = _pack_all(pricing, queue, every_size=True)
    if sum(draft.level for draft in full) < sum(draft.level for draft in fast):
        return drafts + full
    return drafts + fast
