"""The flash backend: THD/SBHD core attention with CP on torch's FlashAttention, no TE needed.

``--attention-backend flash``. Same protocol, masks and CP layout as the reference
:class:`~megatron.varlen.attention.core_attention.VarlenCoreAttention` (which it subclasses for
the constructor and mask handling), but each call is ONE variable-length kernel call laid out
by the micro-batch's :class:`~megatron.varlen.attention.attention_plan.AttentionPlan`:

1. with CP > 1, K and V (concatenated) are all-gathered over the micro-batch's CP group (the
   same differentiable collective as the reference; the group follows dynamic CP);
2. the plan's ``key_index`` picks every segment's key prefix from the gathered rows, its
   ``query_index`` the real query rows of the local shard;
3. ``varlen_attn`` (CUDA) or its plain-torch twin (CPU, tests) runs all segments at once;
4. the output goes back to the query rows; padding rows stay zero.

The plan comes from host copies of the boundaries attached to ``packed_seq_params`` by the data
path, built once per micro-batch: the forward and backward read nothing back from the device.
FlashAttention has no dropout: a non-zero attention dropout is refused at construction.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch

from megatron.varlen.attention.attention_plan import (
    AttentionPlan, attention_plan, build_attention_plan,
)
from megatron.varlen.attention.collectives import all_gather_dim0
from megatron.varlen.attention.core_attention import VANILLA, VarlenCoreAttention
from megatron.varlen.attention.varlen_kernel import VarlenKernel, call_varlen_kernel, kernel_for

# Distinct SBHD shapes whose plans are kept (a run has one or two).
_SBHD_PLAN_CACHE_SIZE = 16


def flash_varlen_attention(
    q_TrND: torch.Tensor, k_TrGD: torch.Tensor, v_TrGD: torch.Tensor, plan: AttentionPlan,
    cp_group, scale: float, kernel: Optional[VarlenKernel] = None,
) -> torch.Tensor:
    """This CP rank's attention output [T_r, N, D] by one kernel call laid out by ``plan``.

    ``plan`` must be the plan for ``cp_group``'s size and rank and the device of ``q_TrND``.
    ``kernel`` defaults to :func:`kernel_for` the tensors' device.
    """
    if cp_group.size() != plan.cp_size:
        raise ValueError(f"attention plan is for a CP group of {plan.cp_size}, the call's "
                         f"group has {cp_group.size()} ranks")
    if plan.cp_size == 1:
        return attend_planned(q_TrND, k_TrGD, v_TrGD, plan, scale, kernel)
    head_dim = k_TrGD.size(-1)
    kv = all_gather_dim0(torch.cat([k_TrGD, v_TrGD], dim=-1), cp_group)
    return attend_planned(q_TrND, kv[..., :head_dim], kv[..., head_dim:], plan, scale, kernel)


def _equal_head_dims(q, k, v):
    """q, k, v with one head width: the narrower side zero-padded (multi-latent attention's
    values are narrower than its queries/keys; FlashAttention takes one width). Zero value
    channels add zero output channels, sliced off after the call; zero query/key channels add
    nothing to the scores (the scale is passed explicitly)."""
    qk_dim, value_dim = q.size(-1), v.size(-1)
    if qk_dim == value_dim:
        return q, k, v
    if value_dim < qk_dim:
        return q, k, torch.nn.functional.pad(v, (0, qk_dim - value_dim))
    pad = (0, value_dim - qk_dim)
    return torch.nn.functional.pad(q, pad), torch.nn.functional.pad(k, pad), v


def attend_planned(
    q_TrND: torch.Tensor, k_rows: torch.Tensor, v_rows: torch.Tensor, plan: AttentionPlan,
    scale: float, kernel: Optional[VarlenKernel] = None,
) -> torch.Tensor:
    """The kernel call of ``plan`` on local queries and the CP group's rank-ordered K/V rows
    (the all-gather's result; the local K/V when CP is 1). Returns [T_r, N, D]."""
    if q_TrND.size(0) != plan.local_tokens:
        raise ValueError(f"attention plan is for {plan.local_tokens} local tokens, the query "
                         f"holds {q_TrND.size(0)}")
    kernel = kernel_for(q_TrND.device) if kernel is None else kernel
    num_heads, value_dim = q_TrND.size(1), v_rows.size(-1)
    if plan.num_segments == 0:  # nothing but padding here: zeros, still part of the graph
        return q_TrND.new_zeros(plan.local_tokens, num_heads, value_dim) + q_TrND[..., :1] * 0
    if plan.key_index is not None:
        k_rows = k_rows.index_select(0, plan.key_index)
        v_rows = v_rows.index_select(0, plan.key_index)
    q = q_TrND if plan.query_index is None else q_TrND.index_select(0, plan.query_index)
    q, k_rows, v_rows = _equal_head_dims(q, k_rows, v_rows)
    out = call_varlen_kernel(kernel, q.contiguous(), k_rows.contiguous(), v_rows.contiguous(),
                             plan.cu_seq_q, plan.cu_seq_k, plan.max_q, plan.max_k, scale,
                             plan.causal, bottom_right=plan.cp_size > 1,
                             window_left=plan.window_left)
    if out.size(-1) != value_dim:  # zero value channels _equal_head_dims added (MLA)
        out = out[..., :value_dim]  # only then: a no-op slice still costs a call per layer
    if plan.query_index is None:
        return out
    return out.new_zeros(plan.local_tokens, num_heads, value_dim).index_copy(
        0, plan.query_index, out)


@functools.lru_cache(maxsize=_SBHD_PLAN_CACHE_SIZE)
def _sbhd_plan(batch: int, seq_len: int, cp_size: int, cp_rank: int, causal: bool,
               window_left: Optional[int], device: str) -> AttentionPlan:
    """Each batch row is one sequence of (global) length ``seq_len``, no padding."""
    cu = [row * seq_len for row in range(batch + 1)]
    return build_attention_plan(cu, cu, cp_size, cp_rank, causal,
                                window_left).to(torch.device(device))


class FlashVarlenCoreAttention(VarlenCoreAttention):
    """megatron-core ``core_attention`` on FlashAttention (``varlen_attn``) with THD and CP.

    Constructor and forward protocol are :class:`VarlenCoreAttention`'s. On CPU the kernel is
    its plain-torch twin (correct, slow: for tests). The ``kernel`` attribute (None: the
    device's kernel) may be set to a replacement with ``varlen_attn``'s signature (tests).

    Raises:
        ValueError: attention dropout > 0 (FlashAttention's varlen kernel has none).
    """

    def __init__(self, config, layer_number, attn_mask_type, attention_type="self",
                 attention_dropout=None, softmax_scale=None, cp_comm_type=None,
                 pg_collection=None, k_channels=None, v_channels=None):
        super().__init__(config, layer_number, attn_mask_type, attention_type,
                         attention_dropout, softmax_scale, cp_comm_type, pg_collection,
                         k_channels, v_channels)
        self.kernel: Optional[VarlenKernel] = None
        if self.softmax_type != VANILLA:
            raise ValueError(f"--attention-backend flash has no attention sink (--softmax-type "
                             f"{self.softmax_type}: torch's varlen_attn has none); use "
                             f"--attention-backend local")
        if self.attention_dropout.p > 0:
            raise ValueError(
                f"--attention-backend flash has no attention dropout (got --attention-dropout "
                f"{self.attention_dropout.p}); set --attention-dropout 0 or use "
                f"--attention-backend local")

    def _forward_thd(self, query, key, value, params, cp_group, causal) -> torch.Tensor:
        has_batch_dim = query.dim() == 4  # [T_r, 1, N, D] instead of [T_r, N, D]
        if has_batch_dim:
            query, key, value = (x.squeeze(1) for x in (query, key, value))
        plan = attention_plan(params, cp_group.size(), cp_group.rank(), causal, query.device,
                              self.window_left)
        out_TrND = flash_varlen_attention(query, key, value, plan, cp_group,
                                          self.softmax_scale, self.kernel)
        out = out_TrND.reshape(out_TrND.size(0), -1)
        return out.unsqueeze(1) if has_batch_dim else out

    def _forward_sbhd(self, query, key, value, cp_group, causal, attention_mask) -> torch.Tensor:
        if attention_mask is not None:  # start-up refuses this (document_arguments.py)
            raise ValueError("--attention-backend flash cannot take a dense attention mask "
                             "(--reset-attention-mask without --sequence-packing): pack the "
                             "documents (--sequence-packing) or use --attention-backend local")
        s, b = query.shape[:2]
        to_packed = lambda x: x.transpose(0, 1).reshape(b * s, *x.shape[2:])
        plan = _sbhd_plan(b, s * cp_group.size(), cp_group.size(), cp_group.rank(), causal,
                          self.window_left, str(query.device))
        out_TND = flash_varlen_attention(to_packed(query), to_packed(key), to_packed(value),
                                         plan, cp_group, self.softmax_scale, self.kernel)
        return out_TND.reshape(b, s, -1).transpose(0, 1).contiguous()

