"""``VarlenTopKRouter``: megatron-core's top-k router whose balancing losses packing and
dynamic CP cannot change (a spec swap of ``MoESubmodules.router``).

Routing itself (scores, top-k, expert bias, capacity) is megatron-core's. What differs is the
domain of each loss (see :mod:`megatron.varlen.model.moe_balancing`): per REAL sequence for
``seq_aux_loss``, the micro-batch's real tokens for ``aux_loss``, counts reduced over the ranks
that hold the tokens (the micro-batch's dynamic CP group, and TP under sequence parallelism),
padding and fillers excluded everywhere. With ``--calculate-per-token-loss`` (implied by
packing) each loss enters the objective weighted by its real token count, so after
``finalize_model_grads`` divides by the global token count the objective is the token-weighted
mean over the global batch, the same for any packing and CP layout.

The layer hands the router its micro-batch (:meth:`VarlenTopKRouter.micro_batch`): megatron-core
0.16.1 passes only a padding mask to the MoE layer, not the packed boundaries.
"""

from __future__ import annotations

import contextlib

import torch

from megatron.core.transformer.moe.moe_utils import (
    MoEAuxLossAutoScaler, apply_router_token_dropping, compute_routing_scores_for_aux_loss,
    topk_routing_with_score_function,
)
from megatron.core.transformer.moe.router import TopKRouter

from megatron.varlen.model import moe_metrics
from megatron.varlen.model.moe_balancing import (
    micro_batch_balancing_part, reduced, sequence_balancing_parts, switch_parts, z_loss_sum,
)
from megatron.varlen.model.moe_sequences import (
    SequenceMap, build_sequence_map, unpacked_micro_batch_cache,
)

AUX, SEQ_AUX, GLOBAL_AUX = "aux_loss", "seq_aux_loss", "global_aux_loss"
ROUTER_DTYPES = {"fp32": torch.float32, "fp64": torch.float64}  # --moe-router-dtype


class VarlenTopKRouter(TopKRouter):
    """Top-k router with layout-invariant balancing losses over real tokens."""

    # (packed_seq_params or None, MTP shift, unpacked micro-batch's cache or None)
    _micro_batch = (None, 0, None)

    def micro_batch(self, packed_seq_params, shift: int = 0, padding_mask=None):
        """Routes the calls inside the block for this micro-batch (None: unpacked [s, b]);
        ``shift``: the MTP depth of the layer (the last ``shift`` positions of each packed
        sequence hold no real token; unpacked, the caller's padding mask says so);
        ``padding_mask``: the layer's [b, s] mask of an unpacked micro-batch, beside which its
        sequence map is kept for the other layers."""
        cache = None if packed_seq_params is not None else unpacked_micro_batch_cache(padding_mask)
        return self.in_micro_batch((packed_seq_params, shift, cache))

    def current_micro_batch(self) -> tuple:
        """The micro-batch the router routes now, for :meth:`in_micro_batch` to route a
        recomputation of the same call with (``--recompute-modules moe``)."""
        return self._micro_batch

    @contextlib.contextmanager
    def in_micro_batch(self, micro_batch: tuple):
        """Routes the calls inside the block for ``micro_batch`` (:meth:`current_micro_batch`)."""
        previous, self._micro_batch = self._micro_batch, micro_batch
        try:
            yield
        finally:
            self._micro_batch = previous

    def gating(self, input: torch.Tensor) -> torch.Tensor:
        """Router logits in --moe-router-dtype (default: the input's), in plain torch:
        megatron-core 0.16.1's gating linear names a Transformer Engine GEMM it never defines
        when TE is not installed (a NameError on every CPU and TE-less GPU run)."""
        dtype = ROUTER_DTYPES.get(self.config.moe_router_dtype, input.dtype)
        bias = None if self.bias is None else self.bias.to(dtype)
        return torch.nn.functional.linear(input.to(dtype), self.weight.to(dtype), bias)

    def _sequence_map(self, padding_mask, shape, device) -> SequenceMap:
        """The rows' sequences and real tokens. Packed, from the micro-batch's host boundaries
        and routed lengths (of which the micro-batch's ``padding_mask`` is derived: the map's
        ``padding`` is the same mask, without a device read); unpacked, from ``padding_mask``."""
        packed_seq_params, shift, unpacked_cache = self._micro_batch
        return build_sequence_map(packed_seq_params, padding_mask, shape, self.cp_group,
                                  self.tp_group, self.config.sequence_parallel, device, shift,
                                  unpacked_cache)

    def routing(self, logits: torch.Tensor, padding_mask: torch.Tensor | None = None):
        """megatron-core's top-k routing; the losses as described in the module docstring."""
        seq_length, bsz = logits.shape[:2]
        logits = logits.view(-1, self.config.num_moe_experts)
        seq_map = self._sequence_map(padding_mask, (seq_length, bsz), logits.device)
        training = self.training and torch.is_grad_enabled()
        if training and self.config.moe_z_loss_coeff is not None:
            logits = self._attach_z_loss(logits, seq_map)
        probs, routing_map = topk_routing_with_score_function(
            logits, self.topk, use_pre_softmax=self.config.moe_router_pre_softmax,
            num_groups=self.config.moe_router_num_groups,
            group_topk=self.config.moe_router_group_topk,
            scaling_factor=self.config.moe_router_topk_scaling_factor,
            score_function=self.score_function, expert_bias=self.expert_bias,
            fused=self.config.moe_router_fusion, router_replay=self.router_replay)
        if self.config.moe_expert_capacity_factor is not None:  # refused with packing
            probs, routing_map = apply_router_token_dropping(
                probs, routing_map, router_topk=self.topk,
                capacity_factor=self.config.moe_expert_capacity_factor,
                drop_policy=self.config.moe_token_drop_policy,
                pad_to_capacity=self.config.moe_pad_expert_input_to_capacity)
        if training and self.is_aux_loss_enabled():
            aux_map, scores = compute_routing_scores_for_aux_loss(
                logits, self.topk, self.score_function, padding_mask=seq_map.padding)
            probs = MoEAuxLossAutoScaler.apply(
                probs, self._balancing_losses(scores, aux_map, seq_map))
        self._apply_expert_bias(routing_map, padding_mask=seq_map.padding.unsqueeze(-1))
        return probs, routing_map

    def _balancing_losses(self, scores, aux_map, seq_map: SequenceMap) -> torch.Tensor:
        """The sum of the enabled balancing losses this rank attaches (scaled for the run's
        loss normalisation), each recorded for the iteration's report."""
        total = scores.new_zeros(())
        coeff = self.get_aux_loss_coeff(SEQ_AUX)
        if coeff > 0:
            parts = sequence_balancing_parts(scores, aux_map, seq_map, self.topk, coeff)
            total = total + self._attach_value(
                SEQ_AUX, coeff, parts, seq_map.real_lengths, seq_map.counts_once)
        coeff = self.get_aux_loss_coeff(AUX)
        if coeff > 0:
            part = micro_batch_balancing_part(scores, aux_map, seq_map, self.topk, coeff)
            total = total + self._attach_value(
                AUX, coeff, part.reshape(1), seq_map.real_lengths.sum().reshape(1),
                seq_map.counts_once)
        coeff = self.get_aux_loss_coeff(GLOBAL_AUX)
        if coeff > 0:
            total = total + self._global_balancing_loss(scores, aux_map, seq_map, coeff)
        return total

    def _attach_value(self, kind: str, coeff: float, parts: torch.Tensor,
                      lengths: torch.Tensor, counts_once: bool) -> torch.Tensor:
        """Per-token loss: each part weighted by its real token count (the objective is then a
        token-weighted mean); otherwise the mean over the parts' domains, as Megatron-LM's
        per-sample mean. Records the token-weighted sum for the report."""
        weighted = (parts * lengths).sum()
        weight = lengths.sum() if counts_once else 0.0
        moe_metrics.record(moe_metrics.METRIC_NAMES[kind], self.layer_number,
                           weighted / coeff, weight)
        if self.calculate_per_token_loss:
            return weighted
        return parts.sum() / max(int((lengths > 0).sum()), 1)

    def _global_balancing_loss(self, scores, aux_map, seq_map: SequenceMap,
                               coeff: float) -> torch.Tensor:
        """Megatron-LM's global aux loss over real tokens: counts over the static TP x DP x CP
        group (every dynamic CP group lies inside it), averaged over the step's micro-batches
        so far (megatron-core's running buffers, reset each step)."""
        valid = seq_map.valid.unsqueeze(-1)
        counts = reduced((aux_map.float() * valid).sum(dim=0).detach(), [self.tp_dp_cp_group])
        self.global_tokens_per_expert += counts
        self.ga_steps += 1
        average = (self.global_tokens_per_expert / self.ga_steps).reshape(1, -1)
        total_tokens = (counts.sum() / self.topk).reshape(1)
        part = switch_parts((scores * valid).sum(dim=0, keepdim=True), average, total_tokens,
                            self.topk, coeff)
        return self._attach_value(GLOBAL_AUX, coeff, part, total_tokens,
                                  self.tp_dp_cp_group.rank() == 0)

    def _attach_z_loss(self, logits: torch.Tensor, seq_map: SequenceMap) -> torch.Tensor:
        """ST-MoE's z-loss over real tokens. Per-token loss: the sum of the per-token terms (no
        division by the TP x CP size, which would tie the loss to the static layout);
        otherwise the micro-batch's mean: this rank's terms over the real tokens of the whole
        micro-batch (on every rank that holds a share of it). megatron-core divides by this
        rank's own count and the TP x CP size instead, which is the same only when every share
        holds as many real tokens: with padding under CP or sequence parallelism it is not
        (probed: grad norm 1.3e-3 off the single rank by iteration 3)."""
        coeff = self.config.moe_z_loss_coeff
        terms = z_loss_sum(logits, seq_map)
        num_tokens = seq_map.valid.sum()
        moe_metrics.record(moe_metrics.Z_LOSS, self.layer_number, terms, num_tokens)
        if self.calculate_per_token_loss:
            z_loss = terms * coeff
        else:
            z_loss = terms / seq_map.real_lengths.sum().clamp(min=1) * coeff
        return MoEAuxLossAutoScaler.apply(logits, z_loss)
