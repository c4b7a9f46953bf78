"""One micro-batch: its phases (front, holes, cover), plain or with growth variants.

Where the token budget stops short sequences from matching a long one, ranks sit idle; *growth
variants* rebuild such a micro-batch under a cap (front sequences get the smallest group whose
time stays under it, so the long ones grow) and the variant with the smallest excess (level
minus absorbed work per rank) is kept: the critical path is total work / N plus the excesses.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Iterator

from megatron.varlen.scheduling.cover import cover_free_ranks
from megatron.varlen.scheduling.draft import MicrobatchDraft
from megatron.varlen.scheduling.front import fill_front
from megatron.varlen.scheduling.holes import fill_holes
from megatron.varlen.scheduling.pricing import ItemPricing
from megatron.varlen.scheduling.seq_queue import SequenceQueue

# Try growth variants only when more than this fraction of a micro-batch's rank-time is idle.
GROWTH_IDLE_TRIGGER = 0.03


def build_microbatch(pricing: ItemPricing, queue: SequenceQueue,
                     cap: float | None = None) -> MicrobatchDraft:
    """Builds one micro-batch, taking its sequences out of ``queue``; under a ``cap`` front
    sequences get the smallest group whose time stays under it. Idle ranks left when the queue
    runs dry join blocks where that does not raise the level (cover.py)."""
    draft = MicrobatchDraft(free_ranks=pricing.num_ranks)
    before = queue.remaining
    fill_front(draft, pricing, queue, cap)
    assert queue.remaining < before, (
        f"no progress with {before} sequences queued: the next one fits no empty micro-batch")
    fill_holes(draft, pricing, queue)
    if draft.free_ranks:
        cover_free_ranks(draft, pricing)
    return draft


def _excess(draft: MicrobatchDraft, pricing: ItemPricing) -> float:
    """Level minus the minimum work the micro-batch takes off the queue, per rank."""
    return draft.level - draft.absorbed_work / pricing.num_ranks


def _needs_growth(draft: MicrobatchDraft, pricing: ItemPricing) -> bool:
    level = draft.level
    idle = pricing.num_ranks * level - draft.busy_rank_time()
    return idle > GROWTH_IDLE_TRIGGER * pricing.num_ranks * level


def cap_thresholds(pricing: ItemPricing, queue: SequenceQueue) -> tuple[list[float], float]:
    """Where capped sizes change: the sorted block times of every queued length on every size
    >= its minimum (``size_under_cap`` depends only on how many the cap reaches), and the
    largest on a minimum group (at or above it, nothing grows)."""
    thresholds, seen, no_growth, pos = [], set(), 0.0, queue.first()
    while pos < queue.end:
        seq = pricing.order[pos]
        if pricing.lengths[seq] not in seen:
            seen.add(pricing.lengths[seq])
            for size in pricing.sizes:
                if size >= pricing.min_size[seq]:
                    thresholds.append(pricing.time_tokens(seq, size)[0] + pricing.latency(size))
            no_growth = max(no_growth, pricing.min_time[seq]
                            + pricing.latency(pricing.min_size[seq]))
        pos = queue.first(pos + 1)
    thresholds.sort()
    return thresholds, no_growth


def growth_caps(pricing: ItemPricing, queue: SequenceQueue, plain_level: float,
                every_size: bool) -> Iterator[float]:
    """Caps of the variants worth building: the block time of the queue's first sequence on
    each size from its minimum (excluded unless ``every_size``) up, below the plain level.
    A variant is a function of its sizes, so under ``every_size`` (the tail: a short queue,
    where listing thresholds is cheap) a cap reaching the same thresholds as an earlier one,
    or growing nothing, would repeat a build and is skipped; otherwise the caps stop there."""
    first = pricing.order[queue.first()]
    thresholds, no_growth = cap_thresholds(pricing, queue) if every_size else ([], plain_level)
    reached_before = set()
    for size in pricing.sizes:
        if size < pricing.min_size[first] or (size == pricing.min_size[first] and not every_size):
            continue
        cap = pricing.time_tokens(first, size)[0] + pricing.latency(size)
        if cap >= no_growth or cap >= plain_level:
            if every_size:
                continue
            return
        if every_size:
            reached = bisect_right(thresholds, cap)
            if reached in reached_before:
                continue
            reached_before.add(reached)
        yield cap


def build_with_growth(pricing: ItemPricing, queue: SequenceQueue,
                      every_size: bool) -> tuple[MicrobatchDraft, SequenceQueue]:
    """The plain micro-batch or, if its ranks idle, its best growth variant, and its queue.

    Padding and the chain's steps make the excess non-monotone in the size. With
    ``every_size`` every size is tried, also for a first sequence that fits one rank
    (attention-heavy costs want it spread) and its own size (the others then grow to match its
    time); otherwise only first sequences that need CP grow, until a size does not improve."""
    first = pricing.order[queue.first()]
    lowest = 1 if every_size else 2
    if not lowest <= pricing.min_size[first] < pricing.sizes[-1]:
        return build_microbatch(pricing, queue), queue
    start = queue.copy()
    best = build_microbatch(pricing, queue)
    if not _needs_growth(best, pricing):
        return best, queue
    best_queue, best_excess = queue, _excess(best, pricing)
    for cap in growth_caps(pricing, start, best.level, every_size):
        trial_queue = start.copy()
        variant = build_microbatch(pricing, trial_queue, cap=cap)
        excess = _excess(variant, pricing)
        if excess < best_excess:
            best, best_queue, best_excess = variant, trial_queue, excess
        elif not every_size:
            break  # larger groups mostly add communication from here on
    return best, best_queue
