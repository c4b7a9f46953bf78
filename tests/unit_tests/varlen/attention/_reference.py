"""Shared pieces of the attention tests: an independent float64 reference and packed inputs.

Shape legend: T = packed padded tokens, N = query heads, G = kv groups, D = head dim,
s = one sequence's tokens.
"""

import math
from types import SimpleNamespace

import torch
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron.varlen.attention import LOCAL_ONLY_CP_GROUP, VarlenCoreAttention

REAL_LENGTHS = [7, 16, 33, 1]
PAD_MULTIPLE = 4
NUM_HEADS, NUM_GROUPS, HEAD_DIM = 4, 2, 8
ATOL = 1e-10


def round_up(x, m):
    return (x + m - 1) // m * m


def cu(lengths):
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)


def make_config(**overrides):
    kwargs = dict(num_layers=1, hidden_size=NUM_HEADS * HEAD_DIM, num_attention_heads=NUM_HEADS,
                  num_query_groups=NUM_GROUPS, attention_dropout=0.0, hidden_dropout=0.0)
    kwargs.update(overrides)
    return TransformerConfig(**kwargs)


def build(cfg=None, cp_group=LOCAL_ONLY_CP_GROUP, **kwargs):
    """A VarlenCoreAttention whose static CP group is ``cp_group`` (TP is one rank)."""
    pgs = SimpleNamespace(tp=LOCAL_ONLY_CP_GROUP, cp=cp_group)
    return VarlenCoreAttention(cfg or make_config(), layer_number=1,
                               attn_mask_type=kwargs.pop("attn_mask_type", AttnMaskType.causal),
                               attention_type="self", pg_collection=pgs, **kwargs)


def reference_attention(q_sND, k_sGD, v_sGD, causal=True, scale=None):
    """Plain softmax attention of ONE sequence (real tokens only), float64."""
    q, k, v = (x.double() for x in (q_sND, k_sGD, v_sGD))
    rep = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    scores = torch.einsum("qnd,knd->nqk", q, k) * scale
    if causal:
        s = q.size(0)
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("nqk,knd->qnd", scores.softmax(-1), v)


def packed_inputs(seed=0, pad_multiple=PAD_MULTIPLE):
    padded = [round_up(L, pad_multiple) for L in REAL_LENGTHS]
    total = sum(padded)
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(total, NUM_HEADS, HEAD_DIM, generator=gen, dtype=torch.float64)
    k = torch.randn(total, NUM_GROUPS, HEAD_DIM, generator=gen, dtype=torch.float64)
    v = torch.randn(total, NUM_GROUPS, HEAD_DIM, generator=gen, dtype=torch.float64)
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu(REAL_LENGTHS),
                             cu_seqlens_kv=cu(REAL_LENGTHS), cu_seqlens_q_padded=cu(padded),
                             cu_seqlens_kv_padded=cu(padded), max_seqlen_q=max(padded),
                             max_seqlen_kv=max(padded))
    return q, k, v, params, padded


def reference_packed(q, k, v, padded, causal=True):
    """Per-sequence reference on real tokens, scattered into the padded layout (zeros in pads)."""
    out = torch.zeros(q.size(0), NUM_HEADS, HEAD_DIM, dtype=torch.float64)
    start = 0
    for real, pad in zip(REAL_LENGTHS, padded):
        sl = slice(start, start + real)
        out[sl] = reference_attention(q[sl], k[sl], v[sl], causal)
        start += pad
    return out
