"""Micro-batch count rules: at least the pipeline depth, a multiple of the VPP group size.

Upstream pads the count by asserting divisibility, which fails on small global batches (8
sequences, group size 4, N = 8). Here the count is *reached* instead: the slowest micro-batch with
two or more sequences is split in two (alternating its sequences, longest first, so the halves
are alike) until the target is met. Empty micro-batches are added only when every micro-batch
already holds a single sequence, i.e. there are fewer sequences than the target.
"""

from __future__ import annotations

import dataclasses

from megatron.varlen.scheduling.draft import MicrobatchDraft
from megatron.varlen.scheduling.packing import pack_sequences
from megatron.varlen.scheduling.pricing import ItemPricing


def target_microbatch_count(current: int, num_sequences: int, pipeline_stages: int,
                            vpp_group_size: int) -> int:
    """Smallest count >= current and >= min(stages, sequences) that is a multiple of the
    VPP group size (at least one group, so an empty batch still runs one step)."""
    wanted = max(current, min(pipeline_stages, num_sequences), 1)
    return -(-wanted // vpp_group_size) * vpp_group_size


def pricing_for_subset(pricing: ItemPricing, seqs: list[int]) -> ItemPricing:
    """A copy of ``pricing`` whose queue is ``seqs`` in packing order."""
    lengths = pricing.lengths
    order = [seq for _, seq in sorted((-lengths[seq], seq) for seq in seqs)]
    return dataclasses.replace(pricing, order=order)


def _split_candidate(drafts: list[MicrobatchDraft]) -> int | None:
    """Index of the slowest micro-batch holding >= 2 sequences (lowest index on ties)."""
    best = None
    for index, draft in enumerate(drafts):
        if draft.num_items >= 2 and (best is None or draft.level > drafts[best].level):
            best = index
    return best


def _split(draft: MicrobatchDraft, pricing: ItemPricing) -> list[MicrobatchDraft]:
    ordered = pricing_for_subset(pricing, draft.item_ids()).order
    halves = (ordered[0::2], ordered[1::2])
    return [part for half in halves
            for part in pack_sequences(pricing_for_subset(pricing, half), allow_growth=False)]


def enforce_microbatch_count(drafts: list[MicrobatchDraft], pricing: ItemPricing,
                             pipeline_stages: int, vpp_group_size: int) -> list[MicrobatchDraft]:
    """Splits (then, if it must, pads with empty micro-batches) to reach the target count."""
    if len(drafts) >= pipeline_stages and len(drafts) % vpp_group_size == 0:
        return list(drafts)  # already the target (so no count of the sequences is needed)
    num_sequences = sum(draft.num_items for draft in drafts)
    drafts = list(drafts)
    target = target_microbatch_count(len(drafts), num_sequences, pipeline_stages, vpp_group_size)
    while len(drafts) < target:
        victim = _split_candidate(drafts)
        if victim is None:
            break
        drafts[victim:victim + 1] = _split(drafts[victim], pricing)
        target = target_microbatch_count(len(drafts), num_sequences, pipeline_stages,
                                         vpp_group_size)
    while len(drafts) < target:
        drafts.append(MicrobatchDraft(free_ranks=pricing.num_ranks))
    return drafts
