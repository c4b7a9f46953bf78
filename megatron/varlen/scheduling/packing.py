"""Level packing: the micro-batch builder shared by dp_balanced and default_dynamic_cp.

Sequences are taken in ``pricing.order`` (longest first). Each micro-batch is built in phases:

1. *Front*: take sequences from the front of the queue. Each opens a block of its CP size while
   free ranks remain, then goes to the block (of a size >= its minimum) where its per-rank time
   ends lowest (LPT). The phase stops at the first sequence no such block can take within the
   token budget, or that would raise the level other than by plain LPT (_should_stop_front).
   Sorted order keeps micro-batches homogeneous, so ranks fill evenly.
2. *Holes*: top up blocks that are below the micro-batch's level with the longest queued
   sequence that fits (best fit, from anywhere in the queue), never raising the level: idle
   time becomes useful work.
3. *Cover*: if the queue ran dry with ranks left over, blocks grow (cover.py) so ranks work
   wherever that does not raise the level.

For the few micro-batches whose ranks sit idle because the token budget stops short sequences
from matching a long one, *growth variants* rebuild the micro-batch with larger groups for the
long sequences and keep the variant with the smallest excess (level minus the work it absorbs
per rank): the critical path is total work / N plus the sum of these excesses.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from heapq import heapify, heappop, heapreplace
from typing import Callable

from megatron.varlen.scheduling.cover import cover_free_ranks
from megatron.varlen.scheduling.draft import MicrobatchDraft
from megatron.varlen.scheduling.lpt_rounds import lpt_in_rounds
from megatron.varlen.scheduling.pricing import ItemPricing
from megatron.varlen.scheduling.problem import pad_multiple
from megatron.varlen.scheduling.seq_queue import SequenceQueue

# Try growth variants only when more than this fraction of a micro-batch's rank-time is idle.
GROWTH_IDLE_TRIGGER = 0.03
# Work a sequence may add (relative) by riding on a larger group than it needs while that
# raises the level; beyond it the ring traffic costs more than the balance it buys.
STACKING_WORK_SLACK = 0.05
# The tail, where packing also tries every group size for a micro-batch's first sequence
# (pack_sequences): this many sequences per rank left, clamped to [MIN, MAX].
FULL_GROWTH_SEARCH_PER_RANK = 2
FULL_GROWTH_SEARCH_MIN = 32
FULL_GROWTH_SEARCH_MAX = 256  # keeps the second tail packing cheap at 1,024 ranks
# From this many blocks on, LPT places sequences in numpy rounds (lpt_rounds.py); below, the
# per-round numpy overhead costs more than the Python rounds (_lpt_sorted_rounds).
LPT_ROUNDS_MIN_BLOCKS = 1024  # break-even measured against a heap loop: about 512 blocks
# After every (time, block) entry, ending the sorted list: reached only when every block has
# been raised in the round, it then comes after the least raised one, so they are merged.
_PAST_ALL = (math.inf, math.inf)
# Candidates tried past the bisection point when padding makes the longest one overflow.
BEST_FIT_PROBES = 3


def _size_under_cap(pricing: ItemPricing, seq: int, cap: float | None) -> int:
    """Smallest allowed size >= the sequence's minimum whose block time stays <= cap."""
    size = pricing.min_size[seq]
    if cap is None or pricing.min_time[seq] + pricing.latency(size) <= cap:
        return size
    for candidate in pricing.sizes:
        if candidate > size:
            size = candidate
            time, _ = pricing.time_tokens(seq, size)
            if time + pricing.latency(size) <= cap:
                break
    return size


def _capped_sizer(pricing: ItemPricing,
                  cap: float | None) -> Callable[[int], tuple[int, float, int]] | None:
    """Per sequence: (``_size_under_cap``, per-rank time and tokens on that size) for one
    build, memoised by length (they depend on nothing else; tails of a batch repeat lengths a
    lot), or None without a cap."""
    if cap is None:
        return None
    lengths, memo = pricing.lengths, {}

    def size_of(seq: int) -> tuple[int, float, int]:
        priced = memo.get(lengths[seq])
        if priced is None:
            size = _size_under_cap(pricing, seq, cap)
            priced = memo[lengths[seq]] = (size, *pricing.time_tokens(seq, size))
        return priced
    return size_of


def _best_block(draft: MicrobatchDraft, pricing: ItemPricing, heaps: dict[int, list],
                seq: int, min_size: int) -> tuple[float, int, float, int] | None:
    """Among the least-loaded block of each size >= min_size that has token room, the one
    where ``seq`` would end lowest: (end time, block, seq time, seq tokens), or None."""
    best = None
    for size, heap in heaps.items():
        if size < min_size:
            continue
        top_time, block = heap[0]
        time, tokens = pricing.time_tokens(seq, size)
        if draft.tokens[block] + tokens > pricing.budget:
            continue
        candidate = (top_time + time, block, time, tokens)
        if best is None or candidate < best:
            best = candidate
    return best


def _should_stop_front(draft: MicrobatchDraft, pricing: ItemPricing, heaps: dict[int, list],
                       seq: int, best: tuple[float, int, float, int], level: float) -> bool:
    """True if the best placement would raise the level although it is not plain LPT: either
    the least-loaded block has no token room (the micro-batch is full for balancing, going on
    would leave its budget-capped blocks idle longer) or the block is larger than the
    sequence needs and the extra ring traffic costs more than STACKING_WORK_SLACK of its work
    (such traffic is only worth paying inside idle time)."""
    end_time, block, time = best[0], best[1], best[2]
    if end_time <= level:
        return False
    least_loaded = min(heap[0][0] for heap in heaps.values())
    if draft.times[block] > least_loaded:
        return True
    extra_work = draft.sizes[block] * time - pricing.min_work[seq]
    return extra_work > STACKING_WORK_SLACK * pricing.min_work[seq]


def _fill_front(draft: MicrobatchDraft, pricing: ItemPricing, queue: SequenceQueue,
                cap: float | None) -> None:
    """Phase 1: opens blocks while ranks are free, then LPT, until the front sequence fits no
    block. The single-size LPT case (most micro-batches) runs in a tight loop."""
    heaps: dict[int, list] = {}
    size_of = _capped_sizer(pricing, cap)
    pos = _open_blocks(draft, pricing, queue, size_of, heaps)
    order, min_size = pricing.order, pricing.min_size
    if cap is None and len(heaps) == 1 and pos < queue.end:
        (size,) = heaps
        if min_size[order[pos]] == size:
            pos = _lpt_single_size(draft, pricing, queue, heaps, pos)
            if pos >= queue.end or min_size[order[pos]] == size:
                return  # stopped on the budget, not on a smaller sequence
    for heap in heaps.values():
        heapify(heap)
    level = draft.level  # kept up to date below: max() per sequence would cost O(N)
    while pos < queue.end:
        seq = order[pos]
        size = min_size[seq] if size_of is None else size_of(seq)[0]
        best = _best_block(draft, pricing, heaps, seq, size)
        if best is None or _should_stop_front(draft, pricing, heaps, seq, best, level):
            return
        end_time, block, time, tokens = best
        if end_time > level:
            level = end_time
        draft.add(block, seq, time, tokens)
        draft.absorbed_work += pricing.min_work[seq]
        heapreplace(heaps[draft.sizes[block]], (draft.times[block], block))
        queue.take(pos)
        pos = queue.first(pos + 1)


def _open_blocks(draft: MicrobatchDraft, pricing: ItemPricing, queue: SequenceQueue,
                 size_of: Callable[[int], tuple[int, float, int]] | None,
                 heaps: dict[int, list]) -> int:
    """Each front sequence opens its own block while enough ranks are free; returns the
    position of the first sequence that did not. ``heaps`` gets the (time, block) entries of
    each size in block order, not yet heapified. Runs of sequences on their minimum group go
    to ``_open_run``; capped sizes above one rank take a step each here, with prices, block
    bookkeeping and queue steps inlined."""
    order, min_size, min_time = pricing.order, pricing.min_size, pricing.min_time
    min_tokens, min_work, d = pricing.min_tokens, pricing.min_work, pricing.d
    sizes, times, tokens, members = draft.sizes, draft.times, draft.tokens, draft.members
    available, end = queue.next_available, queue.end
    free, absorbed, taken = draft.free_ranks, 0.0, 0
    pos = start = queue.first()
    while pos < end:
        seq = order[pos]
        if size_of is None:
            size, time, seq_tokens = min_size[seq], min_time[seq], min_tokens[seq]
        else:
            size, time, seq_tokens = size_of(seq)
        if free < size:
            break
        if size_of is None or size == 1:  # sizes fall with the length, capped or not
            pos, free, absorbed, taken = _open_run(draft, pricing, queue, heaps, pos, free,
                                                   absorbed, taken, size)
            continue
        time += d * (size - 1)  # only capped sizes above one rank get here
        heap = heaps.get(size)
        if heap is None:
            heaps[size] = heap = []
        heap.append((time, len(sizes)))
        sizes.append(size)
        times.append(time)
        tokens.append(seq_tokens)
        members.append([seq])
        free -= size
        absorbed += min_work[seq]
        taken += 1
        pos += 1
        if available[pos] != pos:
            pos = queue.first(pos)
    draft.free_ranks, draft.absorbed_work = free, draft.absorbed_work + absorbed
    queue.remaining -= taken
    queue.skip_taken(start, pos)  # everything before pos is taken now (and not yet linked)
    return pos


def _open_run(draft: MicrobatchDraft, pricing: ItemPricing, queue: SequenceQueue,
              heaps: dict[int, list], pos: int, free: int, absorbed: float, taken: int,
              size: int) -> tuple[int, int, float, int]:
    """``_open_blocks`` for a run of front sequences on their minimum group of ``size`` ranks
    (one rank also under a cap: then it is their minimum): each opens a block while ``size``
    ranks are free. A comprehension per list instead of a loop step per sequence: most
    blocks of most micro-batches are opened here. Returns the loop's (position, free ranks,
    absorbed work, taken) as it would have left them."""
    order, min_size, min_time = pricing.order, pricing.min_size, pricing.min_time
    min_tokens, min_work, end = pricing.min_tokens, pricing.min_work, queue.end
    sizes, times, tokens, members = draft.sizes, draft.times, draft.tokens, draft.members
    latency = pricing.d * (size - 1)
    entries = heaps.setdefault(size, [])
    while free >= size and pos < end and min_size[order[pos]] == size:
        positions, seqs = queue.upcoming_run(pos, free // size, min_size, size)
        if size > 1:
            seq_times = [min_time[seq] + latency for seq in seqs]
        else:
            seq_times = [min_time[seq] for seq in seqs]
        entries += zip(seq_times, range(len(sizes), len(sizes) + len(seqs)))
        sizes += [size] * len(seqs)
        times += seq_times
        tokens += [min_tokens[seq] for seq in seqs]
        members += [[seq] for seq in seqs]
        for seq in seqs:  # one by one in order, as the loop would (the same sum to the bit)
            absorbed += min_work[seq]
        free, taken = free - size * len(seqs), taken + len(seqs)
        pos = queue.first(positions[-1] + 1)
    return pos, free, absorbed, taken


def _lpt_single_size(draft: MicrobatchDraft, pricing: ItemPricing, queue: SequenceQueue,
                     heaps: dict[int, list], pos: int) -> int:
    """LPT onto blocks of one size for sequences whose minimum size is that size. ``heaps``
    holds the blocks' (time, block) entries in block order on entry and every block's entry
    on return (not heapified: _fill_front does that if it goes on). Returns the stop position
    (the token budget, or a smaller sequence)."""
    (size, entries), = heaps.items()
    absorbed, taken, start = 0.0, 0, pos
    if len(entries) >= LPT_ROUNDS_MIN_BLOCKS:
        pos, finished, absorbed, taken = lpt_in_rounds(draft, pricing, queue, entries, size, pos,
                                                       absorbed)
        loads = None if finished else sorted(entries)
    else:
        # Opened longest first, so times do not grow along the block order: reversed, the
        # entries are nearly sorted and the sort is about one pass.
        loads = sorted(reversed(entries))
    if loads is not None:
        pos, absorbed, taken = _lpt_sorted_rounds(draft, pricing, queue, loads, size, pos,
                                                  absorbed, taken)
        entries[:] = loads
    draft.absorbed_work += absorbed
    queue.remaining -= taken
    queue.skip_taken(start, pos)  # everything before pos is taken now (and not yet linked)
    return pos


def _lpt_sorted_rounds(draft: MicrobatchDraft, pricing: ItemPricing, queue: SequenceQueue,
                       loads: list, size: int, pos: int, absorbed: float,
                       taken: int) -> tuple[int, float, int]:
    """The placements of a heap of ``loads`` (one (time, block) per block, sorted; the blocks
    left as they end up): each sequence to the least (time, block), without a heap step.

    The next unraised entry of the sorted list is the least of all unless a block raised in
    this round has come below it (exact tuple comparison: the heap's own order, ties to the
    lower block); then the raised entries are merged back in one sort of two runs. Sequences
    come longest first, so a raised block mostly moves behind the rest and rounds are long:
    a comparison per sequence instead of a dozen in a heap step. Prices, block bookkeeping
    and queue steps are inlined (this loop places most sequences). Returns (position,
    absorbed, taken); the caller links the taken positions (``queue.skip_taken``)."""
    order, min_size, min_time = pricing.order, pricing.min_size, pricing.min_time
    min_tokens, min_work, budget = pricing.min_tokens, pricing.min_work, pricing.budget
    times, tokens, members = draft.times, draft.tokens, draft.members
    available, end = queue.next_available, queue.end
    count = len(loads)
    loads.append(_PAST_ALL)  # so the check below needs no bound test
    # The least raised (time, block) of this round, as two scalars: comparing floats is
    # several times cheaper than comparing tuples.
    nxt, raised, low_time, low_block = 0, [], math.inf, -1
    done = taken  # placed before this round: done + nxt in all
    if size > 1:  # sizes fall with the length: the run of this size ends at one position
        end = bisect_left(order, True, pos, end, key=lambda seq: min_size[seq] < size)
    while pos < end:
        seq = order[pos]
        top_time, block = loads[nxt]
        if low_time < top_time or (low_time == top_time and low_block < block):
            # A raised block is the least (or all are raised): merge.
            loads[:] = sorted(loads[nxt:count] + raised)
            loads.append(_PAST_ALL)
            done, nxt, raised, low_time, low_block = done + nxt, 0, [], math.inf, -1
            top_time, block = loads[0]
        new_tokens = tokens[block] + min_tokens[seq]
        if new_tokens > budget:
            break
        new_time = top_time + min_time[seq]
        times[block] = new_time
        tokens[block] = new_tokens
        members[block].append(seq)
        if new_time < low_time or (new_time == low_time and block < low_block):
            low_time, low_block = new_time, block
        raised.append((new_time, block))
        nxt += 1
        absorbed += min_work[seq]
        pos += 1  # the taken positions are linked by the caller, not one by one
        if available[pos] != pos:
            pos = queue.first(pos)
    loads[:] = loads[nxt:count] + raised
    return pos, absorbed, done + nxt


def _hole_search(pricing: ItemPricing,
                 queue: SequenceQueue) -> Callable[[int, float, int], tuple | None]:
    """Best fit for phase 2: ``fit(size, time_room, token_room)`` is the longest queued
    sequence that fits a block of ``size`` ranks within ``time_room`` and ``token_room``, as
    (position, sequence, time, tokens), or None.

    The longest length whose time fits is the root of the cost's quadratic, rounded down to
    the size's padding multiple (a real length fits iff its padded length does); a bisection
    finds it in the queue, and padding may push the first few candidates over. Prices, the
    root and the queue steps are bound as closure locals and inlined: this runs once per hole
    (hundreds per call), where nested calls cost more than the search itself."""
    order, lengths, min_size = pricing.order, pricing.lengths, pricing.min_size
    min_time, min_tokens = pricing.min_time, pricing.min_tokens
    a, b, g, sp_factor = pricing.a, pricing.b, pricing.g, pricing.sp_factor
    four_a, two_a = 4.0 * a, 2.0 * a
    negated, first, end = queue.negated_lengths, queue.first, queue.end
    available = queue.next_available
    shortest = lengths[order[-1]]
    per_size: dict[int, tuple[float, float, int]] = {}

    def fit(size: int, time_room: float, token_room: int) -> tuple[int, int, float, int] | None:
        if token_room * size < shortest:
            return None  # not even the batch's shortest sequence fits the tokens left
        constants = per_size.get(size)
        if constants is None:
            linear = b + (g * (size - 1) if size > 1 else 0.0)
            multiple = pad_multiple(size, sp_factor)
            constants = per_size[size] = (linear, linear * linear, multiple)
        linear, linear_squared, multiple = constants
        scaled = size * time_room
        if a > 0.0:
            by_time = (math.sqrt(linear_squared + four_a * scaled) - linear) / two_a
        else:
            by_time = scaled / linear
        by_tokens = token_room * size
        # min(by_time, by_tokens) without the builtin's call (a third of this search's time)
        max_length = int(by_tokens if by_tokens < by_time else by_time) // multiple * multiple
        if max_length < 1:
            return None
        pos = bisect_left(negated, -max_length)
        if available[pos] != pos:  # queue.first(pos), inlined for the common case
            pos = first(pos)
        for _ in range(BEST_FIT_PROBES):
            if pos >= end:
                return None
            seq = order[pos]
            seq_size = min_size[seq]
            if seq_size == size:
                time, tokens = min_time[seq], min_tokens[seq]
            elif seq_size < size:  # pricing.time_tokens(seq, size), inlined (most holes)
                padded = -(-lengths[seq] // multiple) * multiple
                time = (a * padded * padded + b * padded) / size
                if size > 1:
                    time += g * padded * (size - 1) / size
                tokens = padded // size
            else:
                pos = first(pos + 1)
                continue
            if time <= time_room and tokens <= token_room:
                return pos, seq, time, tokens
            pos = first(pos + 1)
        return None
    return fit


def _fill_holes(draft: MicrobatchDraft, pricing: ItemPricing, queue: SequenceQueue) -> None:
    """Phase 2: best fit from the whole queue into blocks below the level, least loaded first.
    A block that fits nothing now never will (rooms only shrink), so it leaves the heap; once
    the largest room is below the time of the shortest queued sequence (on any block size:
    a sequence's time grows with its length, and the shortest queued one only gets longer as
    the queue shrinks), no block can take anything. Block and queue updates are inlined
    (``draft.add``, ``queue.take``): this loop runs once per hole."""
    if not queue.remaining:
        return
    level = draft.level
    shortest = queue.order[queue.last()]
    floor = min((pricing.time_tokens(shortest, size)[0] for size in set(draft.sizes)),
                default=0.0)
    if level - min(draft.times, default=level) < floor:
        return  # the loop's first check would stop: most micro-batches have no hole
    heap = list(zip(draft.times, range(len(draft.times))))  # (time, block), built in C
    heapify(heap)
    fit, budget, min_work = _hole_search(pricing, queue), pricing.budget, pricing.min_work
    sizes, times, tokens, members = draft.sizes, draft.times, draft.tokens, draft.members
    available, remaining, absorbed = queue.next_available, queue.remaining, draft.absorbed_work
    while heap and remaining:
        top_time, block = heap[0]
        if level - top_time < floor:
            break
        found = fit(sizes[block], level - top_time, budget - tokens[block])
        if found is None:
            heappop(heap)
            continue
        pos, seq, time, seq_tokens = found
        times[block] += time
        tokens[block] += seq_tokens
        members[block].append(seq)
        absorbed += min_work[seq]
        available[pos] = pos + 1  # queue.take(pos): fit returned an available position
        remaining -= 1
        heapreplace(heap, (times[block], block))
    queue.remaining, draft.absorbed_work = remaining, absorbed


def build_microbatch(pricing: ItemPricing, queue: SequenceQueue,
                     cap: float | None = None) -> MicrobatchDraft:
    """Builds one micro-batch, taking its sequences out of ``queue``.

    Args:
        pricing: Prices and packing order.
        queue: Unscheduled sequences (mutated).
        cap: If set, front sequences get the smallest group whose time stays under it.
    """
    draft = MicrobatchDraft(free_ranks=pricing.num_ranks)
    before = queue.remaining
    _fill_front(draft, pricing, queue, cap)
    assert queue.remaining < before, (
        f"no progress with {before} sequences queued: the next one fits no empty micro-batch")
    _fill_holes(draft, pricing, queue)
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


def _cap_thresholds(pricing: ItemPricing, queue: SequenceQueue) -> tuple[list[float], float]:
    """Where the tail's capped sizes change: the sorted block times (sequence time + group
    latency) of every queued length on every size >= its minimum, and the largest such time
    on a minimum group. ``_size_under_cap`` of every queued sequence depends only on how many
    thresholds the cap reaches, and no sequence grows at or above the second value."""
    order, lengths, min_size = pricing.order, pricing.lengths, pricing.min_size
    thresholds, seen, no_growth, pos = [], set(), 0.0, queue.first()
    while pos < queue.end:
        seq = order[pos]
        if lengths[seq] not in seen:
            seen.add(lengths[seq])
            for size in pricing.sizes:
                if size >= min_size[seq]:
                    thresholds.append(pricing.time_tokens(seq, size)[0] + pricing.latency(size))
            no_growth = max(no_growth, pricing.min_time[seq] + pricing.latency(min_size[seq]))
        pos = queue.first(pos + 1)
    thresholds.sort()
    return thresholds, no_growth


def _build_with_growth(pricing: ItemPricing, queue: SequenceQueue,
                       every_size: bool) -> tuple[MicrobatchDraft, SequenceQueue]:
    """Builds the plain micro-batch and, if a long first sequence leaves ranks idle, the growth
    variants (larger groups for the long sequences); keeps the one with the smallest excess.

    Padding and the chain's steps make the excess non-monotone in the size (2 ranks may tie the
    plain build while 4 or 8 win). With ``every_size`` every size is tried, also for a first
    sequence that fits one rank (attention-heavy costs want it spread). Otherwise only first
    sequences that need CP grow, and the loop stops at the first size that does not improve."""
    first = pricing.order[queue.first()]
    lowest = 1 if every_size else 2
    if not lowest <= pricing.min_size[first] < pricing.sizes[-1]:
        return build_microbatch(pricing, queue), queue
    start = queue.copy()
    best = build_microbatch(pricing, queue)
    if not _needs_growth(best, pricing):
        return best, queue
    best_queue, best_excess = queue, _excess(best, pricing)
    # A variant is a function of its sizes: caps that reach the same thresholds build the
    # same variant, and one at or above no_growth grows nothing, so it is the plain build
    # again (the capped front phase then places exactly as the plain one). Only the tail
    # (a short queue) searches every size, so only there are the thresholds worth listing.
    plain_level = best.level
    thresholds, no_growth = _cap_thresholds(pricing, start) if every_size else ([], plain_level)
    tried = set()
    for size in pricing.sizes:
        # In the tail the first sequence's own size is a cap too: the others then grow to
        # match its time instead of setting a higher level on their minimum groups.
        if size < pricing.min_size[first] or (size == pricing.min_size[first] and not every_size):
            continue
        time, _ = pricing.time_tokens(first, size)
        cap = time + pricing.latency(size)
        if cap >= no_growth or cap >= plain_level:
            # No queued sequence grows (the plain build again), or none of those the plain
            # build holds does (it cannot lower the level, only add communication).
            if every_size:
                continue
            break
        if every_size:
            reached = bisect_right(thresholds, cap)
            if reached in tried:
                continue  # the same sizes as a variant already built
            tried.add(reached)
        trial_queue = start.copy()
        variant = build_microbatch(pricing, trial_queue, cap=cap)
        excess = _excess(variant, pricing)
        if excess < best_excess:
            best, best_queue, best_excess = variant, trial_queue, excess
        elif not every_size:
            break  # larger groups mostly add communication from here on
    return best, best_queue


def _pack_all(pricing: ItemPricing, queue: SequenceQueue, every_size: bool,
              stop_at: int = 0) -> tuple[list[MicrobatchDraft], SequenceQueue]:
    """Micro-batches with growth until at most ``stop_at`` sequences are queued."""
    drafts = []
    while queue.remaining > stop_at:
        draft, queue = _build_with_growth(pricing, queue, every_size)
        drafts.append(draft)
    return drafts, queue


def pack_sequences(pricing: ItemPricing, allow_growth: bool) -> list[MicrobatchDraft]:
    """Packs every sequence of ``pricing.order`` into micro-batches.

    With growth, the *tail* (the last max(min(2N, 256), 32) sequences: the end of a batch, or
    all of a small one) is packed twice, with the fast growth policy and with the full search over
    every size, and the one with the shorter critical path is kept: the full search fixes the
    attention-heavy and few-sequence cases (issue 12), while the greedy excess rule it relies
    on can lose a little elsewhere, so neither policy is ever worse than the other here."""
    queue = SequenceQueue(pricing.order, pricing.lengths, pricing.order_negated_lengths)
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
