"""Multiply-adds of a multi-latent attention layer, counted as Megatron-LM's
``num_floating_point_operations`` counts them (its MLA branch), and its weight in the packing
scheduler's cost model.

Per token (forward): queries h*n*(d+r) directly, or through the rank-q latent
q*(h + n*(d+r) + 1) (the ``+ 1``: the latent norm, one multiply-add per channel, as Megatron-LM
counts it whether or not the layer has one); the key/value latent c*(h + n*(d+e) + 1) plus the
shared rotated key h*r; the output projection n*e*h. Per sequence of length L (causal half of
the pairs, forward): QK^T n*(d+r)*L^2/2 and AV n*e*L^2/2 multiply-adds. n heads, d plain and r
rotated query/key channels per head, e value channels, c = --kv-lora-rank.
"""

from __future__ import annotations

from megatron.varlen_training.config import ModelConfig

LATENT_NORM_MACS_PER_CHANNEL = 1  # Megatron-LM's "+ 1" per latent channel


def mla_linear_macs_per_token(model: ModelConfig) -> int:
    """Projections of one MLA layer per token (forward), latent norms included."""
    mla, h, n = model.mla, model.hidden_size, model.num_attention_heads
    if mla.q_lora_rank is None:
        queries = h * n * mla.q_head_dim
    else:
        queries = mla.q_lora_rank * (h + n * mla.q_head_dim + LATENT_NORM_MACS_PER_CHANNEL)
    keys_values = (mla.kv_lora_rank * (h + n * (mla.qk_head_dim + mla.v_head_dim)
                                       + LATENT_NORM_MACS_PER_CHANNEL)
                   + h * mla.qk_pos_emb_head_dim)
    return queries + keys_values + n * mla.v_head_dim * h


def core_attention_flops_per_squared_token(model: ModelConfig) -> int:
    """Forward FLOPs of one layer's core attention per unit of L^2 (causal: half the pairs,
    2 FLOPs per multiply-add): n*(query/key width + value width) per head, i.e. 2*q with
    standard attention's q = heads x head dim."""
    n = model.num_attention_heads
    if model.mla is None:
        return 2 * n * model.head_dim
    return n * (model.mla.q_head_dim + model.mla.v_head_dim)


def attention_cost_scale(model: ModelConfig) -> float:
    """The packing scheduler's quadratic coefficient relative to a standard layer's (whose
    core attention reads and writes ``hidden_size`` channels per token: a = 1). 1.0 without
    MLA (the dense convention, kept for GQA and --kv-channels too)."""
    if model.mla is None:
        return 1.0
    return core_attention_flops_per_squared_token(model) / (2 * model.hidden_size)
