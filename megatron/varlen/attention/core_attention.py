"""Plain-torch core attention for packed (THD) and plain (SBHD) batches, with context parallelism.

Used as the ``core_attention`` of megatron-core's ``SelfAttention`` on CPU (and anywhere
Transformer Engine is absent). Causal (or full) attention, GQA, padding slots masked, no
attention across packed sequences, and CP: each rank holds, per sequence, chunks r and
2cp-1-r of the padded sequence (see :mod:`megatron.varlen.cp_split`); K and V are all-gathered
over the CP group with a differentiable collective and local queries attend at their GLOBAL
positions. A reference implementation: it materialises one [heads, sq, sk] score matrix per
sequence, which is fine for tests and CPU runs, not for long-context GPU training (use TE there).

Shape legend:
    n    = sequences in the pack
    T    = packed padded tokens of the whole pack (cu_seqlens_padded[-1], before the CP split)
    T_r  = tokens this CP rank holds (T / cp)
    s, b = local sequence length and batch size of an sbhd batch (S = s * cp globally)
    N    = query heads on this TP rank, G = key/value groups on this TP rank (G divides N)
    D    = head dim (kv_channels)
    sq, sk = query rows / key columns of one sequence
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.tensor_parallel import random as tp_random
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron.varlen.attention.collectives import all_gather_dim0
from megatron.varlen.attention.cp_group import resolve_cp_group
from megatron.varlen.cp_split import get_thd_partition_indices, get_thd_restore_order

# Self-attention has sq == sk per sequence, so bottom-right causal is plain causal.
CAUSAL_MASK_TYPES = (
    AttnMaskType.causal, AttnMaskType.padding_causal, AttnMaskType.causal_bottom_right,
)
FULL_MASK_TYPES = (AttnMaskType.no_mask, AttnMaskType.padding)
THD_FORMAT = "thd"
SBHD_FORMAT = "sbhd"
_LOW_PRECISION = (torch.float16, torch.bfloat16)

DropoutFn = Callable[[torch.Tensor], torch.Tensor]


def _expand_kv_heads(x_TGD: torch.Tensor, num_heads: int) -> torch.Tensor:
    """GQA: query head h reads key/value group h // (N / G) (megatron's layout)."""
    num_groups = x_TGD.size(1)
    assert num_heads % num_groups == 0, f"{num_heads} query heads, {num_groups} kv groups"
    return x_TGD.repeat_interleave(num_heads // num_groups, dim=1)


def _attend_one_sequence(
    q_qND: torch.Tensor, k_kND: torch.Tensor, v_kND: torch.Tensor, q_pos: torch.Tensor,
    real_len: int, causal: bool, scale: float, dropout: Optional[DropoutFn],
) -> torch.Tensor:
    """Attention of one sequence's local query rows (at positions ``q_pos``) over all its keys.

    Keys at or beyond ``real_len`` (padding) are masked; query rows in padding return zeros.
    """
    compute_dtype = torch.float32 if q_qND.dtype in _LOW_PRECISION else q_qND.dtype
    scores_Nqk = torch.einsum("qnd,knd->nqk", q_qND.to(compute_dtype), k_kND.to(compute_dtype))
    k_pos = torch.arange(k_kND.size(0), device=q_qND.device)
    allowed_qk = (k_pos[None, :] < real_len) & (q_pos[:, None] < real_len)
    if causal:
        allowed_qk = allowed_qk & (k_pos[None, :] <= q_pos[:, None])
    # A finite fill (not -inf) keeps fully masked rows NaN-free; they are zeroed just below.
    scores_Nqk = (scores_Nqk * scale).masked_fill(~allowed_qk, torch.finfo(compute_dtype).min)
    probs_Nqk = torch.softmax(scores_Nqk, dim=-1) * allowed_qk.any(dim=-1)[:, None]
    if dropout is not None:
        probs_Nqk = dropout(probs_Nqk)
    return torch.einsum("nqk,knd->qnd", probs_Nqk.to(v_kND.dtype), v_kND)


def _gather_full_kv(
    k_TrGD: torch.Tensor, v_TrGD: torch.Tensor, cu_seqlens_padded: torch.Tensor, group
) -> tuple[torch.Tensor, torch.Tensor]:
    """All-gathers K and V (one collective) and restores the whole pack's order [T, G, D]."""
    head_dim = k_TrGD.size(-1)
    kv_TGD = all_gather_dim0(torch.cat([k_TrGD, v_TrGD], dim=-1), group)
    order = get_thd_restore_order(cu_seqlens_padded.cpu(), group.size()).to(kv_TGD.device)
    kv_TGD = kv_TGD.index_select(0, order)
    return kv_TGD[..., :head_dim], kv_TGD[..., head_dim:]


def varlen_attention(
    q_TrND: torch.Tensor, k_TrGD: torch.Tensor, v_TrGD: torch.Tensor,
    cu_seqlens_padded: torch.Tensor, cu_seqlens: torch.Tensor, cp_group, causal: bool,
    scale: float, dropout: Optional[DropoutFn] = None,
) -> torch.Tensor:
    """Packed attention of this CP rank's tokens; returns [T_r, N, D].

    Args:
        q_TrND, k_TrGD, v_TrGD: this rank's CP shard of the packed padded stream.
        cu_seqlens_padded: [n+1] padded boundaries of the WHOLE pack (before the CP split).
        cu_seqlens: [n+1] real boundaries (real length i = cu[i+1] - cu[i]).
        cp_group: anything with ``size()``/``rank()``; size 1 means no collective at all.
        causal: causal within each sequence (always block-diagonal across sequences).
        scale: softmax scale.
        dropout: applied to the attention probabilities when given.
    """
    cp_size, cp_rank = cp_group.size(), cp_group.rank()
    cu_padded = cu_seqlens_padded.detach().cpu().long()
    real_lens = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    if q_TrND.size(0) * cp_size != int(cu_padded[-1]):
        raise ValueError(
            f"query holds {q_TrND.size(0)} tokens on a CP group of {cp_size}, but "
            f"cu_seqlens_padded describes {int(cu_padded[-1])}: pass the boundaries of the "
            f"whole pack (before the CP split)"
        )
    q_index = get_thd_partition_indices(cu_padded, cp_size, cp_rank).to(q_TrND.device)
    if cp_size > 1:
        k_TrGD, v_TrGD = _gather_full_kv(k_TrGD, v_TrGD, cu_padded, cp_group)
    k_TND = _expand_kv_heads(k_TrGD, q_TrND.size(1))
    v_TND = _expand_kv_heads(v_TrGD, q_TrND.size(1))
    starts, local_bounds = cu_padded.tolist(), (cu_padded // cp_size).tolist()
    outputs = []
    for i, real_len in enumerate(real_lens):
        lo, hi = local_bounds[i], local_bounds[i + 1]
        if hi == lo:
            continue
        start, end = starts[i], starts[i + 1]
        outputs.append(_attend_one_sequence(
            q_TrND[lo:hi], k_TND[start:end], v_TND[start:end], q_index[lo:hi] - start,
            real_len, causal, scale, dropout,
        ))
    if not outputs:
        return q_TrND.new_zeros(0, q_TrND.size(1), v_TrGD.size(-1))
    return torch.cat(outputs, dim=0)


def _thd_boundaries(params: PackedSeqParams) -> tuple[torch.Tensor, torch.Tensor]:
    """(cu_seqlens_padded, cu_seqlens) of a THD self-attention micro-batch."""
    if params.cu_seqlens_q is None:
        raise ValueError("THD attention needs packed_seq_params.cu_seqlens_q")
    for q_name, kv_name in (("cu_seqlens_q", "cu_seqlens_kv"),
                            ("cu_seqlens_q_padded", "cu_seqlens_kv_padded")):
        q_val, kv_val = getattr(params, q_name), getattr(params, kv_name)
        if q_val is None or kv_val is None:
            continue
        if not torch.equal(q_val.cpu().long(), kv_val.cpu().long()):
            raise ValueError(f"self-attention needs {q_name} == {kv_name}")
    cu_real = params.cu_seqlens_q.detach().cpu().long()
    padded = params.cu_seqlens_q_padded
    cu_padded = cu_real if padded is None else padded.detach().cpu().long()
    if cu_padded.shape != cu_real.shape:
        raise ValueError("cu_seqlens_q_padded and cu_seqlens_q must have one entry per sequence")
    if bool((cu_padded.diff() < cu_real.diff()).any()):
        raise ValueError("every padded length must be >= its real length")
    return cu_padded, cu_real


class VarlenCoreAttention(MegatronModule):
    """megatron-core ``core_attention`` for THD/SBHD, causal, GQA and (dynamic) CP, plain torch.

    Built by ``SelfAttention`` with the keywords of megatron-core 0.16.1's
    ``CoreAttentionBuilder``; ``forward`` follows its ``CoreAttention`` protocol. The CP group
    of a call is ``packed_seq_params.cp_group`` when set, else the static ``pg_collection.cp``
    (see :func:`resolve_cp_group`); a group of size 1 makes no collective call.

    Args:
        config: the transformer config (reads kv_channels, attention_dropout, softmax_scale,
            softmax_type, window_size, sequence_parallel).
        layer_number: 1-based layer index (kept for megatron's bookkeeping).
        attn_mask_type: causal/padding_causal (causal) or no_mask/padding (full attention).
        attention_type: "self" (cross attention with a different KV layout is not supported).
        attention_dropout: overrides ``config.attention_dropout``.
        softmax_scale: overrides the default ``1/sqrt(kv_channels)``. With
            ``config.apply_query_key_layer_scaling`` megatron divides the scale by the layer
            number and multiplies the scores back inside its softmax: the same math, so here it
            changes nothing (it only matters for fp16 overflow in megatron's kernels).
        cp_comm_type: accepted for protocol compatibility; the exchange is always an all-gather.
        pg_collection: process groups; ``cp`` is the static CP group. Defaults to parallel_state.
    """

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str = "self",
        attention_dropout: Optional[float] = None,
        softmax_scale: Optional[float] = None,
        cp_comm_type: Optional[str] = None,
        pg_collection: Optional[ProcessGroupCollection] = None,
    ):
        super().__init__(config=config)
        if getattr(config, "softmax_type", "vanilla") != "vanilla":
            raise ValueError(f"VarlenCoreAttention supports softmax_type='vanilla' only, got "
                             f"{config.softmax_type!r}")
        if getattr(config, "window_size", None) is not None:
            raise ValueError("VarlenCoreAttention does not support window_size (sliding window)")
        self.layer_number = max(1, layer_number)
        self.attn_mask_type = attn_mask_type
        self.attention_type = attention_type
        self.cp_comm_type = cp_comm_type
        if pg_collection is None:
            pg_collection = ProcessGroupCollection.use_mpu_process_groups(required_pgs=["tp", "cp"])
        self.pg_collection = pg_collection
        self.cp_group = pg_collection.cp
        default_scale = 1.0 / math.sqrt(config.kv_channels)
        self.softmax_scale = default_scale if softmax_scale is None else softmax_scale
        dropout_p = config.attention_dropout if attention_dropout is None else attention_dropout
        self.attention_dropout = torch.nn.Dropout(dropout_p)

    def _dropout_fn(self) -> Optional[DropoutFn]:
        if not self.training or self.attention_dropout.p == 0.0:
            return None
        if self.config.sequence_parallel:
            return self.attention_dropout

        def forked_dropout(probs: torch.Tensor) -> torch.Tensor:
            # The TP-region RNG stream: reproducible per TP rank, like DotProductAttention.
            with tp_random.get_cuda_rng_tracker().fork():
                return self.attention_dropout(probs)

        return forked_dropout

    def _is_causal(self, attn_mask_type: Optional[AttnMaskType]) -> bool:
        mask_type = self.attn_mask_type if attn_mask_type is None else attn_mask_type
        if mask_type in CAUSAL_MASK_TYPES:
            return True
        if mask_type in FULL_MASK_TYPES:
            return False
        raise ValueError(f"VarlenCoreAttention does not support attn_mask_type {mask_type}")

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: Optional[torch.Tensor],
        attn_mask_type: Optional[AttnMaskType] = None,
        attention_bias: Optional[torch.Tensor] = None,
        packed_seq_params: Optional[PackedSeqParams] = None,
    ) -> torch.Tensor:
        """Attention output: sbhd [s, b, N*D]; thd [T_r, N*D] (or [T_r, 1, N*D] for 4-D input).

        ``attention_mask`` is ignored: the mask follows from ``attn_mask_type`` and the
        sequence boundaries in ``packed_seq_params`` (as Transformer Engine does for causal).
        """
        if attention_bias is not None:
            raise ValueError("VarlenCoreAttention does not support attention_bias")
        del attention_mask
        causal = self._is_causal(attn_mask_type)
        cp_group = resolve_cp_group(packed_seq_params, self.cp_group)
        qkv_format = SBHD_FORMAT if packed_seq_params is None else packed_seq_params.qkv_format
        if qkv_format == THD_FORMAT:
            return self._forward_thd(query, key, value, packed_seq_params, cp_group, causal)
        if qkv_format not in (SBHD_FORMAT, None):
            raise ValueError(f"VarlenCoreAttention supports thd and sbhd, got {qkv_format!r}")
        return self._forward_sbhd(query, key, value, cp_group, causal)

    def _forward_thd(self, query, key, value, params, cp_group, causal) -> torch.Tensor:
        has_batch_dim = query.dim() == 4  # [T_r, 1, N, D] instead of [T_r, N, D]
        if has_batch_dim:
            query, key, value = (x.squeeze(1) for x in (query, key, value))
        cu_padded, cu_real = _thd_boundaries(params)
        out_TrND = varlen_attention(query, key, value, cu_padded, cu_real, cp_group, causal,
                                    self.softmax_scale, self._dropout_fn())
        out = out_TrND.reshape(out_TrND.size(0), -1)
        return out.unsqueeze(1) if has_batch_dim else out

    def _forward_sbhd(self, query, key, value, cp_group, causal) -> torch.Tensor:
        s, b = query.shape[:2]
        # Each batch row is one sequence of global length S = s * cp, split by the same rule.
        to_packed = lambda x: x.transpose(0, 1).reshape(b * s, *x.shape[2:])
        cu = torch.arange(b + 1, dtype=torch.long) * (s * cp_group.size())
        out_TND = varlen_attention(to_packed(query), to_packed(key), to_packed(value), cu, cu,
                                   cp_group, causal, self.softmax_scale, self._dropout_fn())
        return out_TND.reshape(b, s, -1).transpose(0, 1).contiguous()
