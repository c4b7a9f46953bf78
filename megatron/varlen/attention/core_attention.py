"""Plain-torch core attention for packed (THD) and plain (SBHD) batches, with context parallelism.

Used as the ``core_attention`` of megatron-core's ``SelfAttention`` on CPU (and anywhere Transformer
Engine is absent). Causal (or full) attention, a causal sliding window (``--window-size``), an
attention sink (``--softmax-type off-by-one/learnable``), GQA, padding slots masked, no
attention across packed sequences, and CP: each rank holds, per sequence, chunks r and 2cp-1-r
of the padded sequence (see :mod:`megatron.varlen.packing.cp_split`); K and V are all-gathered
over the CP group with a differentiable collective and local queries attend at their GLOBAL
positions. A reference
implementation: it materialises one [heads, sq, sk] score matrix per sequence, which is fine for
tests and CPU runs, not for long-context GPU training (use TE there). Its index layout
(:class:`LocalLayout`) comes from the host boundaries the data path attaches, built once per
micro-batch: like the flash backend, no layer reads anything back from the device.

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

import functools
import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.tensor_parallel import random as tp_random
from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.utils import (
    ensure_metadata_has_dp_cp_group, make_sharded_tensors_for_checkpoint,
)

from megatron.varlen.attention.collectives import all_gather_dim0
from megatron.varlen.attention.cp_group import resolve_cp_group
from megatron.varlen.attention.sliding_window import layer_window
from megatron.varlen.packing.cp_split import get_thd_partition_indices, get_thd_restore_order
from megatron.varlen.packing.packed_seq import (
    HostBoundaries, MicroBatchCache, has_host_boundaries, host_boundaries, host_to_device, on_host,
)

# Self-attention has sq == sk per sequence, so bottom-right causal is plain causal.
CAUSAL_MASK_TYPES = (
    AttnMaskType.causal, AttnMaskType.padding_causal, AttnMaskType.causal_bottom_right,
)
FULL_MASK_TYPES = (AttnMaskType.no_mask, AttnMaskType.padding)
# The CP exchange this module implements; megatron-core passes None when CP is off or unset.
SUPPORTED_CP_COMM_TYPES = (None, "all_gather")
# megatron-core's softmax_type: no sink, a zero sink logit per row, a learned one per head
VANILLA, OFF_BY_ONE, LEARNABLE = "vanilla", "off-by-one", "learnable"
SINK_PARAMETER = "softmax_offset"  # megatron-core's name (DotProductAttention, checkpoints)
THD_FORMAT = "thd"
SBHD_FORMAT = "sbhd"
_LOW_PRECISION = (torch.float16, torch.bfloat16)
_LOCAL_LAYOUT = "local-attention-layout"  # kind of the micro-batch cache's entry
# Distinct SBHD shapes whose layouts are kept (a run has one or two).
_SBHD_LAYOUT_CACHE_SIZE = 16

DropoutFn = Callable[[torch.Tensor], torch.Tensor]


def _expand_kv_heads(x_TGD: torch.Tensor, num_heads: int) -> torch.Tensor:
    """GQA: query head h reads key/value group h // (N / G) (megatron's layout)."""
    num_groups = x_TGD.size(1)
    assert num_heads % num_groups == 0, f"{num_heads} query heads, {num_groups} kv groups"
    return x_TGD.repeat_interleave(num_heads // num_groups, dim=1)


def _attend_one_sequence(
    q_qND: torch.Tensor, k_kND: torch.Tensor, v_kND: torch.Tensor, q_pos: torch.Tensor,
    real_len: int, causal: bool, scale: float, dropout: Optional[DropoutFn],
    blocked_qk: Optional[torch.Tensor] = None, window_left: Optional[int] = None,
    sink_N: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Attention of one sequence's local query rows (at positions ``q_pos``) over all its keys.

    Keys at or beyond ``real_len`` (padding) are masked; query rows in padding return zeros.
    ``window_left``: a query sees no key more than that many positions before it. ``sink_N``:
    per head, a logit (in scaled-score units, as megatron-core's) that joins every row's
    softmax without a value: the row's weights then sum to less than one.
    ``blocked_qk`` (bool [sq, sk], True = masked, Megatron's convention) masks more: the
    unpacked path's per-sample mask (``--reset-attention-mask``).
    """
    compute_dtype = torch.float32 if q_qND.dtype in _LOW_PRECISION else q_qND.dtype
    scores_Nqk = torch.einsum("qnd,knd->nqk", q_qND.to(compute_dtype), k_kND.to(compute_dtype))
    k_pos = torch.arange(k_kND.size(0), device=q_qND.device)
    allowed_qk = (k_pos[None, :] < real_len) & (q_pos[:, None] < real_len)
    if causal:
        allowed_qk = allowed_qk & (k_pos[None, :] <= q_pos[:, None])
    if window_left is not None:
        allowed_qk = allowed_qk & (k_pos[None, :] >= q_pos[:, None] - window_left)
    if blocked_qk is not None:
        allowed_qk = allowed_qk & ~blocked_qk
    # A finite fill (not -inf) keeps fully masked rows NaN-free; they are zeroed just below.
    scores_Nqk = (scores_Nqk * scale).masked_fill(~allowed_qk, torch.finfo(compute_dtype).min)
    if sink_N is None:
        probs_Nqk = torch.softmax(scores_Nqk, dim=-1)
    else:  # one more column per row, dropped after the softmax
        sink_Nq1 = sink_N.to(compute_dtype)[:, None, None].expand(-1, scores_Nqk.size(1), 1)
        probs_Nqk = torch.softmax(torch.cat([scores_Nqk, sink_Nq1], dim=-1), dim=-1)[..., :-1]
    probs_Nqk = probs_Nqk * allowed_qk.any(dim=-1)[:, None]
    if dropout is not None:
        probs_Nqk = dropout(probs_Nqk)
    return torch.einsum("nqk,knd->qnd", probs_Nqk.to(v_kND.dtype), v_kND)


@dataclass(frozen=True)
class LocalLayout:
    """Where this CP rank's rows sit in the pack, for :func:`attend_with_layout`.

    Host ints for the per-sequence loop and index tensors already on the compute device, built
    once per micro-batch (and CP place) from host boundaries: the forward and backward then read
    nothing back from the device.
    """

    cp_size: int
    local_tokens: int                  # T_r
    real_lens: tuple[int, ...]         # [n] real length of each sequence
    starts: tuple[int, ...]            # [n+1] padded boundaries of the whole pack
    local_bounds: tuple[int, ...]      # [n+1] padded boundaries of this rank's shard
    q_pos: torch.Tensor                # [T_r] each local row's position within its sequence
    restore: Optional[torch.Tensor]    # [T] gathered rank-ordered rows -> pack order (CP > 1)


def build_local_layout(cu_seqlens_padded: torch.Tensor, cu_seqlens: torch.Tensor, cp_size: int,
                       cp_rank: int, device: torch.device) -> LocalLayout:
    """The layout of ``cp_rank``'s rows from HOST boundaries of the whole pack (see
    :func:`varlen_attention` for the arguments); index tensors moved to ``device``.

    Raises:
        ValueError: malformed boundaries (from :mod:`megatron.varlen.packing.cp_split`).
    """
    cu_padded, cu_real = cu_seqlens_padded.long(), cu_seqlens.long()
    q_index = get_thd_partition_indices(cu_padded, cp_size, cp_rank)
    starts, local_bounds = cu_padded.tolist(), (cu_padded // cp_size).tolist()
    # The sequence start of every local row: local rows [lo, hi) belong to sequence i.
    local_lens = torch.tensor(local_bounds).diff()
    q_pos = q_index - torch.repeat_interleave(cu_padded[:-1], local_lens)
    restore = get_thd_restore_order(cu_padded, cp_size) if cp_size > 1 else None
    return LocalLayout(
        cp_size=cp_size, local_tokens=local_bounds[-1], real_lens=tuple(cu_real.diff().tolist()),
        starts=tuple(starts), local_bounds=tuple(local_bounds),
        q_pos=host_to_device(q_pos, device),
        restore=None if restore is None else host_to_device(restore, device))


def _gather_full_kv(
    k_TrGD: torch.Tensor, v_TrGD: torch.Tensor, restore_T: torch.Tensor, group
) -> tuple[torch.Tensor, torch.Tensor]:
    """All-gathers K and V (one collective) and restores the whole pack's order [T, G, D]."""
    head_dim = k_TrGD.size(-1)
    kv_TGD = all_gather_dim0(torch.cat([k_TrGD, v_TrGD], dim=-1), group)
    kv_TGD = kv_TGD.index_select(0, restore_T)
    return kv_TGD[..., :head_dim], kv_TGD[..., head_dim:]


def varlen_attention(
    q_TrND: torch.Tensor, k_TrGD: torch.Tensor, v_TrGD: torch.Tensor,
    cu_seqlens_padded: torch.Tensor, cu_seqlens: torch.Tensor, cp_group, causal: bool,
    scale: float, dropout: Optional[DropoutFn] = None, window_left: Optional[int] = None,
    sink_N: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Packed attention of this CP rank's tokens; returns [T_r, N, D].

    A standalone call: it reads the boundaries to the host (use :func:`attend_with_layout`
    with a layout built once to avoid that per call).

    Args:
        q_TrND, k_TrGD, v_TrGD: this rank's CP shard of the packed padded stream.
        cu_seqlens_padded: [n+1] padded boundaries of the WHOLE pack (before the CP split).
        cu_seqlens: [n+1] real boundaries (real length i = cu[i+1] - cu[i]).
        cp_group: anything with ``size()``/``rank()``; size 1 means no collective at all.
        causal: causal within each sequence (always block-diagonal across sequences).
        scale: softmax scale.
        dropout: applied to the attention probabilities when given.
        window_left: a causal sliding window: each query sees this many earlier keys (None:
            all of them).
        sink_N: an attention sink logit per query head (None: the plain softmax).
    """
    layout = build_local_layout(cu_seqlens_padded.detach().cpu(), cu_seqlens.detach().cpu(),
                                cp_group.size(), cp_group.rank(), q_TrND.device)
    return attend_with_layout(q_TrND, k_TrGD, v_TrGD, layout, cp_group, causal, scale, dropout,
                              window_left=window_left, sink_N=sink_N)


def attend_with_layout(
    q_TrND: torch.Tensor, k_TrGD: torch.Tensor, v_TrGD: torch.Tensor, layout: LocalLayout,
    cp_group, causal: bool, scale: float, dropout: Optional[DropoutFn] = None,
    blocked_nqk: Optional[torch.Tensor] = None, window_left: Optional[int] = None,
    sink_N: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """:func:`varlen_attention` with a prebuilt ``layout`` (for ``cp_group``'s size and rank
    and the tensors' device): no device->host read. ``blocked_nqk``: per sequence, its local
    query rows x all its keys, True = masked (the SBHD path's dense mask; None: none)."""
    if window_left is not None and not causal:
        raise ValueError("a sliding window (--window-size) needs causal attention")
    if q_TrND.size(0) != layout.local_tokens or cp_group.size() != layout.cp_size:
        raise ValueError(
            f"query holds {q_TrND.size(0)} tokens on a CP group of {cp_group.size()}, but "
            f"cu_seqlens_padded describes {layout.starts[-1]}: pass the boundaries of the "
            f"whole pack (before the CP split)"
        )
    if layout.cp_size > 1:
        k_TrGD, v_TrGD = _gather_full_kv(k_TrGD, v_TrGD, layout.restore, cp_group)
    k_TND = _expand_kv_heads(k_TrGD, q_TrND.size(1))
    v_TND = _expand_kv_heads(v_TrGD, q_TrND.size(1))
    starts, local_bounds = layout.starts, layout.local_bounds
    outputs = []
    for i, real_len in enumerate(layout.real_lens):
        lo, hi = local_bounds[i], local_bounds[i + 1]
        if hi == lo:
            continue
        start, end = starts[i], starts[i + 1]
        outputs.append(_attend_one_sequence(
            q_TrND[lo:hi], k_TND[start:end], v_TND[start:end], layout.q_pos[lo:hi],
            real_len, causal, scale, dropout,
            None if blocked_nqk is None else blocked_nqk[i], window_left, sink_N,
        ))
    if not outputs:
        return q_TrND.new_zeros(0, q_TrND.size(1), v_TrGD.size(-1))
    return torch.cat(outputs, dim=0)


def _thd_boundaries(params: PackedSeqParams) -> tuple[torch.Tensor, torch.Tensor]:
    """(cu_seqlens_padded, cu_seqlens) of a THD self-attention micro-batch, read to the host."""
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
    return cu_padded, cu_real


def _check_host_boundaries(cu_padded: torch.Tensor, cu_real: torch.Tensor) -> None:
    if cu_padded.shape != cu_real.shape:
        raise ValueError("cu_seqlens_q_padded and cu_seqlens_q must have one entry per sequence")
    if bool((cu_padded.diff() < cu_real.diff()).any()):
        raise ValueError("every padded length must be >= its real length")


def thd_layout(params: PackedSeqParams, cp_size: int, cp_rank: int,
               device: torch.device) -> LocalLayout:
    """The micro-batch's layout for one CP place, built once per micro-batch from the host
    boundaries the data path made (read back, and checked, when params carry none: then per
    call, as nothing can be cached on a plain ``PackedSeqParams``)."""
    if has_host_boundaries(params):
        host = host_boundaries(params)
    else:
        cu_padded, cu_real = _thd_boundaries(params)
        host = HostBoundaries(on_host(cu_real), on_host(cu_padded), MicroBatchCache())

    def build() -> LocalLayout:
        _check_host_boundaries(host.cu_seqlens_padded, host.cu_seqlens)
        return build_local_layout(host.cu_seqlens_padded, host.cu_seqlens, cp_size, cp_rank,
                                  device)

    return host.cache.get((_LOCAL_LAYOUT, cp_size, cp_rank, str(device)), build)


@functools.lru_cache(maxsize=_SBHD_LAYOUT_CACHE_SIZE)
def _sbhd_layout(batch: int, seq_len: int, cp_size: int, cp_rank: int,
                 device: str) -> LocalLayout:
    """Each batch row is one sequence of (global) length ``seq_len``, no padding."""
    cu = torch.arange(batch + 1, dtype=torch.long) * seq_len
    return build_local_layout(cu, cu, cp_size, cp_rank, torch.device(device))


class VarlenCoreAttention(MegatronModule):
    """megatron-core ``core_attention`` for THD/SBHD, causal, GQA and (dynamic) CP, plain torch.

    Built by ``SelfAttention`` with the keywords of megatron-core 0.16.1's
    ``CoreAttentionBuilder``; ``forward`` follows its ``CoreAttention`` protocol. The CP group
    of a call is ``packed_seq_params.cp_group`` when set, else the static ``pg_collection.cp``
    (see :func:`resolve_cp_group`); a group of size 1 makes no collective call.

    Args:
        config: the transformer config (reads kv_channels, attention_dropout, softmax_scale,
            softmax_type, window_size, window_attn_skip_freq, sequence_parallel; with
            softmax_type learnable also num_attention_heads, params_dtype, init_method).
        layer_number: 1-based layer index: whether ``window_size`` applies to this layer
            (``window_attn_skip_freq``), and megatron's bookkeeping.
        attn_mask_type: causal/padding_causal (causal) or no_mask/padding (full attention).
        attention_type: "self" (cross attention with a different KV layout is not supported).
        attention_dropout: overrides ``config.attention_dropout``.
        softmax_scale: overrides the default ``1/sqrt(k_channels)``. With
            ``config.apply_query_key_layer_scaling`` megatron divides the scale by the layer
            number and multiplies the scores back inside its softmax: the same math, so here it
            changes nothing (it only matters for fp16 overflow in megatron's kernels).
        cp_comm_type: None or ``"all_gather"``, the one exchange implemented (K/V all-gathered
            over the CP group); megatron-core's other values (``p2p``, ``a2a``, ``a2a+p2p``)
            are refused in one line rather than silently run as an all-gather.
        pg_collection: process groups; ``cp`` is the static CP group. Defaults to parallel_state.
        k_channels, v_channels: channels of a query/key head and of a value head (default
            ``kv_channels``); they differ under multi-latent attention, which passes both. The
            output has ``v_channels`` per head.
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
        k_channels: Optional[int] = None,
        v_channels: Optional[int] = None,
    ):
        super().__init__(config=config)
        if cp_comm_type not in SUPPORTED_CP_COMM_TYPES:
            raise ValueError(
                f"cp_comm_type {cp_comm_type!r} is not implemented by {type(self).__name__}: it "
                f"all-gathers K and V over the CP group (supported: all_gather; "
                f"TransformerConfig.cp_comm_type, flag --cp-comm-type)")
        self.layer_number = max(1, layer_number)
        # megatron-core's choice of the windowed layers (is_layer_window_attention), as TE's
        self.window_left = layer_window(getattr(config, "window_size", None),
                                        getattr(config, "window_attn_skip_freq", None),
                                        layer_number)
        self.attn_mask_type = attn_mask_type
        self.attention_type = attention_type
        self.cp_comm_type = cp_comm_type
        if pg_collection is None:
            pg_collection = ProcessGroupCollection.use_mpu_process_groups(required_pgs=["tp", "cp"])
        self.pg_collection = pg_collection
        self.cp_group = pg_collection.cp
        self.softmax_type = getattr(config, "softmax_type", VANILLA)
        self.softmax_offset = self._sink_parameter(config, pg_collection)
        # The kernels read head widths off the tensors; only the default scale needs k's.
        self.k_channels = k_channels or config.kv_channels
        self.v_channels = v_channels or config.kv_channels
        default_scale = 1.0 / math.sqrt(self.k_channels)
        self.softmax_scale = default_scale if softmax_scale is None else softmax_scale
        dropout_p = config.attention_dropout if attention_dropout is None else attention_dropout
        self.attention_dropout = torch.nn.Dropout(dropout_p)

    def _sink_parameter(self, config, pg_collection) -> Optional[torch.nn.Parameter]:
        """``learnable``: one sink logit per query head of this TP rank, split over TP like the
        heads (megatron-core's ``softmax_offset``, initialised by ``config.init_method``)."""
        if self.softmax_type not in (VANILLA, OFF_BY_ONE, LEARNABLE):
            raise ValueError(f"softmax_type {self.softmax_type!r}: choose {VANILLA}, "
                             f"{OFF_BY_ONE} or {LEARNABLE} (--softmax-type)")
        if self.softmax_type != LEARNABLE:
            return None
        heads = config.num_attention_heads // pg_collection.tp.size()
        sink = torch.nn.Parameter(torch.empty(heads, dtype=config.params_dtype))
        set_tensor_model_parallel_attributes(sink, is_parallel=True, dim=0, stride=1)
        if config.perform_initialization:
            config.init_method(sink.data)
        return sink

    def _sink_logits(self, query: torch.Tensor) -> Optional[torch.Tensor]:
        """The per-head sink logits of this call (None without a sink)."""
        if self.softmax_type == LEARNABLE:
            return self.softmax_offset
        if self.softmax_type == OFF_BY_ONE:  # exp(0) = 1 joins every row's denominator
            return query.new_zeros(query.size(-2))
        return None

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (),
                           metadata: Optional[dict] = None):
        """A learnable sink is split over TP along its heads (as megatron-core's
        DotProductAttention saves it); nothing else here holds state."""
        if self.softmax_offset is None:
            return super().sharded_state_dict(prefix, sharded_offsets, metadata)
        metadata = ensure_metadata_has_dp_cp_group(metadata)
        return make_sharded_tensors_for_checkpoint(
            self.state_dict(prefix="", keep_vars=True), prefix, {SINK_PARAMETER: 0},
            sharded_offsets, tp_group=self.pg_collection.tp,
            dp_cp_group=metadata["dp_cp_group"])

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

        THD: the mask follows from ``attn_mask_type`` and the sequence boundaries in
        ``packed_seq_params`` (as Transformer Engine does for causal); ``attention_mask`` must
        be None. SBHD: ``attention_mask`` (bool [b, 1, s, S], True = masked: Megatron-LM's
        per-sample mask of ``--reset-attention-mask``, query rows CP-split like the tokens)
        masks on top of ``attn_mask_type``.
        """
        if attention_bias is not None:
            raise ValueError("VarlenCoreAttention does not support attention_bias")
        causal = self._is_causal(attn_mask_type)
        cp_group = resolve_cp_group(packed_seq_params, self.cp_group)
        qkv_format = SBHD_FORMAT if packed_seq_params is None else packed_seq_params.qkv_format
        if qkv_format == THD_FORMAT:
            if attention_mask is not None:
                raise ValueError("THD attention takes no attention_mask: packed sequences are "
                                 "separated by cu_seqlens")
            return self._forward_thd(query, key, value, packed_seq_params, cp_group, causal)
        if qkv_format not in (SBHD_FORMAT, None):
            raise ValueError(f"VarlenCoreAttention supports thd and sbhd, got {qkv_format!r}")
        return self._forward_sbhd(query, key, value, cp_group, causal, attention_mask)

    def _forward_thd(self, query, key, value, params, cp_group, causal) -> torch.Tensor:
        has_batch_dim = query.dim() == 4  # [T_r, 1, N, D] instead of [T_r, N, D]
        if has_batch_dim:
            query, key, value = (x.squeeze(1) for x in (query, key, value))
        layout = thd_layout(params, cp_group.size(), cp_group.rank(), query.device)
        out_TrND = attend_with_layout(query, key, value, layout, cp_group, causal,
                                      self.softmax_scale, self._dropout_fn(),
                                      window_left=self.window_left,
                                      sink_N=self._sink_logits(query))
        out = out_TrND.reshape(out_TrND.size(0), -1)
        return out.unsqueeze(1) if has_batch_dim else out

    def _forward_sbhd(self, query, key, value, cp_group, causal, attention_mask) -> torch.Tensor:
        s, b = query.shape[:2]
        blocked_bqk = None if attention_mask is None else attention_mask[:, 0]
        # Each batch row is one sequence of global length S = s * cp, split by the same rule.
        to_packed = lambda x: x.transpose(0, 1).reshape(b * s, *x.shape[2:])
        layout = _sbhd_layout(b, s * cp_group.size(), cp_group.size(), cp_group.rank(),
                              str(query.device))
        out_TND = attend_with_layout(to_packed(query), to_packed(key), to_packed(value), layout,
                                     cp_group, causal, self.softmax_scale, self._dropout_fn(),
                                     blocked_bqk, self.window_left, self._sink_logits(query))
        return out_TND.reshape(b, s, -1).transpose(0, 1).contiguous()
