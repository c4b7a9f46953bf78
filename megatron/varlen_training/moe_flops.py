"""Multiply-adds of the MLP half of a layer per token, MoE layers counting ACTIVATED experts.

A dense MLP: h*f*(2 if gated else 1) + f*h. An MoE layer: the router h*E, the top-k routed
experts k * (h*f_e*(2 if gated else 1) + f_e*h) with f_e = --moe-ffn-hidden-size, and the shared
expert (--moe-shared-expert-intermediate-size) every token goes through. Without token dropping
(refused with packing) every token reaches exactly k experts, so the count is exact, and linear
in the tokens: it enters the FLOPs through sum(L) like every other token-linear term.
"""

from __future__ import annotations

from megatron.varlen_training.config import ModelConfig
from megatron.varlen_training.mla_flops import mla_linear_macs_per_token


def mlp_macs(hidden: int, ffn: int, gated: bool) -> int:
    """Multiply-adds of one MLP per token (forward)."""
    return hidden * ffn * (2 if gated else 1) + ffn * hidden


def dense_mlp_macs_per_token(model: ModelConfig) -> int:
    return mlp_macs(model.hidden_size, model.ffn_hidden_size, model.gated_mlp)


def moe_mlp_macs_per_token(model: ModelConfig) -> int:
    """Router + top-k routed experts + the shared expert, per token (forward)."""
    moe, h = model.moe, model.hidden_size
    expert = mlp_macs(h, moe.moe_ffn_hidden_size or model.ffn_hidden_size, model.gated_mlp)
    shared = moe.moe_shared_expert_intermediate_size
    return (h * moe.num_experts + moe.moe_router_topk * expert
            + (mlp_macs(h, shared, model.gated_mlp) if shared else 0))


def decoder_mlp_macs_per_token(model: ModelConfig) -> int:
    """The MLP halves of all decoder layers per token: MoE where --moe-layer-freq says."""
    if model.moe is None:
        return model.num_layers * dense_mlp_macs_per_token(model)
    flags = model.moe.is_moe_layer(model.num_layers)
    return (sum(flags) * moe_mlp_macs_per_token(model)
            + (model.num_layers - sum(flags)) * dense_mlp_macs_per_token(model))


def attention_linear_macs_per_token(model: ModelConfig) -> int:
    """QKV and output projections of one attention layer per token (forward); multi-latent
    attention's projections with --multi-latent-attention (mla_flops.py)."""
    if model.mla is not None:
        return mla_linear_macs_per_token(model)
    q_dim = model.num_attention_heads * model.head_dim  # --kv-channels where given
    kv_dim = model.num_query_groups * model.head_dim
    return model.hidden_size * (q_dim + 2 * kv_dim) + q_dim * model.hidden_size


def linear_cost_scale(model: ModelConfig) -> float:
    """How much more (or less) token-linear work a layer of this model does than the same
    layer with a dense MLP: the packing scheduler's linear coefficient ``b`` is scaled by it
    (1.0 for a dense model, whose ``b`` is unchanged). Activated experts only: routed tokens
    reach k experts, whatever the CP group their sequence runs on."""
    if (model.moe is None and model.mla is None) or model.hybrid is not None:
        # Hybrid stacks keep the dense coefficient: their Mamba layers' linear work is not in
        # the b = 6h convention either (docs/MOE.md).
        return 1.0
    # The b = 6h convention is a standard layer's: MLA's projections are measured against the
    # standard attention of the same heads (so a dense non-MLA model keeps 1.0).
    standard = _standard_attention_macs_per_token(model)
    dense = model.num_layers * (standard + dense_mlp_macs_per_token(model))
    return (model.num_layers * attention_linear_macs_per_token(model)
            + decoder_mlp_macs_per_token(model)) / dense


def _standard_attention_macs_per_token(model: ModelConfig) -> int:
    """QKV and output projections of a standard (non-MLA) layer of the model's heads."""
    q_dim = model.num_attention_heads * model.head_dim
    kv_dim = model.num_query_groups * model.head_dim
    return model.hidden_size * (q_dim + 2 * kv_dim) + q_dim * model.hidden_size
