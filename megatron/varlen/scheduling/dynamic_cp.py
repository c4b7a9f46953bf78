"""``default_dynamic_cp``: a CP group size per sequence, balanced over all DPxCP ranks.

Each sequence gets at least the smallest group of the layout (groups.py) whose per-rank padded
tokens fit the budget (and --min-dynamic-context-parallel-size). Level packing (packing.py)
evens out every rank's estimated time, growing long sequences' groups where that shortens a
micro-batch; light micro-batches dissolve into others (dissolve.py), the count rules apply
(counts.py) and small batches are polished (polish.py). The static dp_balanced schedule is kept
instead if shorter, so dynamic CP is never worse than dp_balanced at the same budget.
"""

from __future__ import annotations

from megatron.varlen.scheduling.counts import enforce_microbatch_count
from megatron.varlen.scheduling.cover import cover_free_ranks
from megatron.varlen.scheduling.dissolve import move_out_of_light_microbatches
from megatron.varlen.scheduling.dp_balanced import build_static_drafts
from megatron.varlen.scheduling.draft import MicrobatchDraft, drafts_to_schedule
from megatron.varlen.scheduling.gc_pause import gc_paused
from megatron.varlen.scheduling.packing import pack_sequences
from megatron.varlen.scheduling.polish import polish_small_batch
from megatron.varlen.scheduling.pricing import ItemPricing, padded_lengths_array, price_items
from megatron.varlen.scheduling.problem import Schedule, ScheduleProblem

DYNAMIC_FLAG_HINT = " or lower --min-dynamic-context-parallel-size"


def _critical_path(drafts: list[MicrobatchDraft]) -> float:
    return sum(draft.level for draft in drafts)


def _static_lower_bound(problem: ScheduleProblem) -> float:
    """Simple lower bound of any schedule that keeps every sequence on cp_size ranks: the
    longest sequence, or the total work spread over every rank."""
    cp = problem.cp_size
    time = problem.cost.time(padded_lengths_array(problem.lengths, cp, problem.sp_factor), cp)
    return float(max(time.sum() * cp / problem.num_ranks, time.max(initial=0.0)))


def _static_fallback(problem: ScheduleProblem, pricing: ItemPricing,
                     dynamic_path: float) -> list[MicrobatchDraft] | None:
    """dp_balanced drafts with idle ranks covered, or None if static groups are not allowed
    or cannot beat ``dynamic_path`` (its lower bound already does not)."""
    if (problem.cp_size not in pricing.sizes
            or _static_lower_bound(problem) >= dynamic_path):
        return None
    try:
        drafts = build_static_drafts(problem)
    except ValueError:
        return None  # some sequence does not fit its static CP group
    for draft in drafts:
        if draft.free_ranks and draft.sizes:
            cover_free_ranks(draft, pricing)
    return drafts


def default_dynamic_cp(problem: ScheduleProblem) -> Schedule:
    """Schedules ``problem`` with a per-sequence CP size over all DPxCP ranks."""
    with gc_paused():
        # The working state (prices, queues, drafts) dies with _schedule's frame, while the
        # collector is still paused: re-enabled, it then only sees the Schedule's objects
        # (otherwise its first collection walks every draft and price list once, for nothing).
        return _schedule(problem)


def _schedule(problem: ScheduleProblem) -> Schedule:
    pricing = price_items(problem, problem.layout.sequence_sizes, DYNAMIC_FLAG_HINT)
    drafts = move_out_of_light_microbatches(pack_sequences(pricing, allow_growth=True),
                                            pricing)
    drafts = enforce_microbatch_count(drafts, pricing, problem.min_num_microbatches,
                                      problem.vpp_group_size)
    drafts = polish_small_batch(drafts, pricing)
    dynamic_path = _critical_path(drafts)
    fallback = _static_fallback(problem, pricing, dynamic_path)
    if fallback is not None and _critical_path(fallback) < dynamic_path:
        drafts = fallback
    return drafts_to_schedule(problem, drafts)
