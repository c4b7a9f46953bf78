"""Every rank of every micro-batch gets work: for data paths that cannot run an idle rank.

Our scheduler leaves a rank idle where any work there would slow its micro-batch (cover.py);
our data path runs a dummy on it. Megatron-LM's data path packs the samples a rank holds and
has no dummy, so the upstream patch (sample_id_groups.py) fills idle ranks first:

* borrow: sequences of other micro-batches move onto the free ranks where that changes no
  micro-batch's level (each from a block of two or more that is not its micro-batch's slowest,
  onto the largest group on which it stays within this micro-batch's level);

then, one step at a time, each the step after which the micro-batch's slowest block is fastest:

* grow: a block moves one step up the size chain when the free ranks allow it;
* merge: when no block can grow (a chain step larger than the free ranks, e.g. 4 -> 12), the
  least-loaded blocks of the smallest size join the free ranks as one block of the next size
  (cover.py's merge, without its level limit).

Borrowing keeps every level; a step may raise it (the price of a busy rank). Neither breaks the
budget. A micro-batch without any sequence cannot be filled: an error of the caller's counts.
"""

from __future__ import annotations

import math

from megatron.varlen.scheduling.cover import merge_smallest
from megatron.varlen.scheduling.draft import MicrobatchDraft, drafts_to_schedule, price_bag
from megatron.varlen.scheduling.pricing import ItemPricing, price_items
from megatron.varlen.scheduling.problem import Schedule, ScheduleProblem


def _draft_of(ranks: tuple[tuple[int, ...], ...], schedule: Schedule,
              pricing: ItemPricing) -> MicrobatchDraft:
    """The blocks of one laid-out micro-batch, in rank order (largest first, as laid out)."""
    draft = MicrobatchDraft(free_ranks=len(ranks))
    rank = 0
    while rank < len(ranks):
        ids = ranks[rank]
        if not ids:
            rank += 1
            continue
        size = schedule.cp_sizes[ids[0]]
        time, tokens = price_bag(list(ids), size, pricing)
        draft.open_block(ids[0], size, time, tokens)
        draft.members[-1] = list(ids)
        rank += size
    return draft


def _grow_lowest(draft: MicrobatchDraft, pricing: ItemPricing) -> bool:
    """Grows one block one chain step, the one after which the micro-batch ends lowest (then
    the one whose new time is least); False if no block can grow within the budget."""
    best = None
    for block, size in enumerate(draft.sizes):
        larger = pricing.next_size(size)
        if larger is None or larger - size > draft.free_ranks:
            continue
        time, tokens = draft.reprice_block(block, larger, pricing)
        others = max((other for index, other in enumerate(draft.times) if index != block),
                     default=0.0)
        if tokens <= pricing.budget and (best is None or (max(time, others), time) < best[0]):
            best = ((max(time, others), time), block, larger, tokens)
    if best is None:
        return False
    (_, time), block, larger, tokens = best
    draft.resize_block(block, larger, time, tokens)
    return True


def _borrow_size(pricing: ItemPricing, seq: int, free_ranks: int, level: float):
    """The largest group (size, time, tokens) of at most ``free_ranks`` on which ``seq`` alone
    stays within ``level`` and the budget, or None."""
    for size in reversed(pricing.sizes):
        if pricing.min_size[seq] <= size <= free_ranks:
            time, tokens = pricing.time_tokens(seq, size)
            time += pricing.latency(size)
            if time <= level and tokens <= pricing.budget:
                return size, time, tokens
    return None


def _borrow(drafts: list[MicrobatchDraft], pricing: ItemPricing, target: int) -> None:
    """Moves sequences of other micro-batches onto the free ranks of ``target``, each on the
    largest group it fits without raising ``target``'s level; only the last-placed sequence of
    a block of two or more that is not its micro-batch's slowest, so no level changes."""
    draft, level = drafts[target], drafts[target].level
    for source in (drafts[index] for index in range(len(drafts)) if index != target):
        for block, members in enumerate(source.members):
            while draft.free_ranks and len(members) > 1 and source.times[block] < source.level:
                seq = members[-1]
                group = _borrow_size(pricing, seq, draft.free_ranks, level)
                if group is None:
                    break
                source.remove(block, seq, *pricing.time_tokens(seq, source.sizes[block]))
                draft.open_block(seq, *group)
            if not draft.free_ranks:
                return


def _fill(draft: MicrobatchDraft, pricing: ItemPricing, index: int) -> None:
    if not draft.sizes:
        raise ValueError(f"micro-batch {index} holds no sequence, so no rank of it can work "
                         "(fewer sequences than the micro-batch count needs)")
    while draft.free_ranks > 0:
        if not (_grow_lowest(draft, pricing) or merge_smallest(draft, pricing, math.inf)):
            raise ValueError(f"micro-batch {index}: {draft.free_ranks} idle ranks cannot get "
                             f"work without a rank exceeding the budget {pricing.budget}")


def fill_idle_ranks(problem: ScheduleProblem, schedule: Schedule) -> Schedule:
    """``schedule`` with no idle rank; micro-batches without one are returned unchanged.

    Raises:
        ValueError: a micro-batch without sequences, or idle ranks only the budget forbids.
    """
    if all(ids for ranks in schedule.microbatches for ids in ranks):
        return schedule
    pricing = price_items(problem, problem.layout.sequence_sizes, "")
    drafts = [_draft_of(ranks, schedule, pricing) for ranks in schedule.microbatches]
    for index, draft in enumerate(drafts):
        if draft.free_ranks and draft.sizes:
            _borrow(drafts, pricing, index)
    for index, draft in enumerate(drafts):
        _fill(draft, pricing, index)
    return drafts_to_schedule(problem, drafts)
