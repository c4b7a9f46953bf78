"""``dp_balanced`` (alias ``default``): static CP, balanced across DP by estimated cost.

Every sequence runs on its static CP group (cp_size ranks, padded to a multiple of 2*cp*sp).
The DP groups are the blocks of a micro-batch, so the level packing of packing.py balances the
cost model's time (not just tokens, unlike upstream's next-fit) across DP groups, under the
per-rank token budget, and keeps long sequences together in the same micro-batches.
"""

from __future__ import annotations

from megatron.varlen.scheduling.counts import enforce_microbatch_count
from megatron.varlen.scheduling.draft import MicrobatchDraft, drafts_to_schedule
from megatron.varlen.scheduling.gc_pause import gc_paused
from megatron.varlen.scheduling.packing import pack_sequences
from megatron.varlen.scheduling.pricing import price_items
from megatron.varlen.scheduling.problem import Schedule, ScheduleProblem

STATIC_FLAG_HINT = " or --context-parallel-size, or use --dynamic-context-parallel"


def build_static_drafts(problem: ScheduleProblem) -> list[MicrobatchDraft]:
    """The dp_balanced micro-batches as drafts (also used by dynamic CP as its fallback)."""
    pricing = price_items(problem, (problem.cp_size,), STATIC_FLAG_HINT)
    drafts = pack_sequences(pricing, allow_growth=False)
    return enforce_microbatch_count(drafts, pricing, problem.min_num_microbatches,
                                    problem.vpp_group_size)


def dp_balanced(problem: ScheduleProblem) -> Schedule:
    """Schedules ``problem`` on the static CP groups, balancing cost across DP ranks."""
    with gc_paused():
        return drafts_to_schedule(problem, build_static_drafts(problem))
