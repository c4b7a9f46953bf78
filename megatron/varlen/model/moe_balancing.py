"""The MoE load-balancing losses over REAL tokens, per real sequence where the loss says so.

megatron-core 0.16.1 computes ``seq_aux_loss`` by reshaping the router input to
``[seq_length, batch * experts]``: on a THD pack (batch 1) that is ONE loss over the whole
micro-batch, and its counts are reduced over the static TP x CP group, not over the dynamic CP
group the micro-batch runs on. Packing would then change the model that is trained. Here:

* ``seq_aux_loss``: one Switch-style loss per real sequence (its tokens, its real length),
  counts reduced over the ranks that hold that sequence (:class:`SequenceMap.groups`);
* ``aux_loss``: the same over the micro-batch's real tokens (Megatron-LM's domain: the
  micro-batch on its TP x CP ranks; under dynamic CP the micro-batch's own CP group);
* padding and pad-only fillers route nowhere in any statistic.

Each function returns THIS rank's part of the loss: the local router scores times the reduced
counts, so the parts of all ranks sharing a sequence add up to the sequence's loss (gradients
flow through the local scores only, as upstream). Pure torch apart from the count reductions.

Legend: T = router rows of this rank, E = experts, n = sequences of the micro-batch.
"""

from __future__ import annotations

import torch

from megatron.varlen.model.moe_sequences import SequenceMap, sum_slots


def per_sequence_sums(values_te: torch.Tensor, seq_index_t: torch.Tensor,
                      num_sequences: int, slots_t: torch.Tensor | None = None) -> torch.Tensor:
    """[n, E] sums of ``values_te`` rows per sequence; PADDING rows are dropped. ``slots_t``:
    :func:`~megatron.varlen.model.moe_sequences.sum_slots` of ``seq_index_t`` when already
    made (a SequenceMap caches it)."""
    slot = sum_slots(seq_index_t, num_sequences) if slots_t is None else slots_t
    sums = values_te.new_zeros(num_sequences + 1, values_te.shape[-1])
    return sums.index_add(0, slot, values_te)[:num_sequences]


def reduced(tensor: torch.Tensor, groups) -> torch.Tensor:
    """``tensor`` summed over every group in ``groups`` (in place; no autograd)."""
    for group in groups:
        torch.distributed.all_reduce(tensor, group=group)
    return tensor


def switch_parts(score_sums_ne: torch.Tensor, counts_ne: torch.Tensor,
                 real_lengths_n: torch.Tensor, topk: int, coeff: float) -> torch.Tensor:
    """[n] this rank's part of ``coeff * E * sum_i f_i P_i`` per sequence, with
    f_i = count_i / (k T) and P_i = score sum_i / T over the sequence's T real tokens
    (0 for sequences without real tokens)."""
    num_experts = score_sums_ne.shape[-1]
    lengths = real_lengths_n.to(score_sums_ne.dtype)
    scale = coeff * num_experts / (topk * lengths.clamp(min=1) ** 2)
    parts = (score_sums_ne * counts_ne.to(score_sums_ne.dtype)).sum(dim=-1) * scale
    return torch.where(lengths > 0, parts, torch.zeros_like(parts))


def sequence_balancing_parts(scores_te: torch.Tensor, routing_map_te: torch.Tensor,
                             seq_map: SequenceMap, topk: int, coeff: float) -> torch.Tensor:
    """[n] this rank's part of every sequence's ``seq_aux_loss`` (counts reduced over the
    sequence's ranks)."""
    n = seq_map.num_sequences
    counts = reduced(per_sequence_sums(routing_map_te.float(), seq_map.seq_index, n,
                                       seq_map.sum_slots).detach(), seq_map.groups)
    sums = per_sequence_sums(scores_te, seq_map.seq_index, n, seq_map.sum_slots)
    return switch_parts(sums, counts, seq_map.real_lengths, topk, coeff)


def micro_batch_balancing_part(scores_te: torch.Tensor, routing_map_te: torch.Tensor,
                               seq_map: SequenceMap, topk: int, coeff: float) -> torch.Tensor:
    """[] this rank's part of the micro-batch's ``aux_loss`` over its real tokens."""
    valid = seq_map.valid.unsqueeze(-1)
    counts = reduced((routing_map_te.float() * valid).sum(dim=0, keepdim=True).detach(),
                     seq_map.groups)
    sums = (scores_te * valid).sum(dim=0, keepdim=True)
    total = seq_map.real_lengths.sum().reshape(1)
    return switch_parts(sums, counts, total, topk, coeff)[0]


def z_loss_sum(logits_te: torch.Tensor, seq_map: SequenceMap) -> torch.Tensor:
    """[] sum over this rank's real tokens of logsumexp(logits)^2 (ST-MoE's z-loss terms)."""
    terms = torch.logsumexp(logits_te, dim=-1).square()
    return (terms * seq_map.valid).sum()
