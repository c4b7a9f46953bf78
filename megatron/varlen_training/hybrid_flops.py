"""Model FLOPs of one training step of a hybrid Mamba-Transformer, from REAL lengths.

Per layer and token (forward, multiply-add = 2 FLOPs), by pattern symbol:

* ``*`` attention: QKV 2*h*(q + 2*kv) + output projection 2*q*h, plus causal attention
  2*q*L^2 per sequence of length L (the only quadratic term, as in flops.py), 2*q*m*(2L - m)
  on a layer --window-size windows (by its pattern position; window_layers.py);
* ``-`` MLP: 2*h*f*(2 if gated else 1) + 2*f*h;
* ``E`` MoE: the router and the activated experts (top-k routed + shared), moe_flops.py;
* ``M`` Mamba-2: in-projection 2*h*(2*d_inner + 2*g*n + H), depthwise causal conv
  2*(d_inner + 2*g*n)*w, the scan 3 * 2*d_inner*n (state decay, state update dt*x B^T, output
  S C: each one multiply-add per state entry per token -- LINEAR in L, whatever the chunking),
  out-projection 2*d_inner*h.

Plus the logits 2*h*V per token; training = 3 x forward. Elementwise work (norms, gates,
softplus, D skip) is not counted, as in flops.py.
"""

from __future__ import annotations

from megatron.varlen_training.config.model import ATTENTION, MAMBA, MLP, MOE, ModelConfig
from megatron.varlen_training.flops import FORWARD_AND_BACKWARD, MULTIPLY_ADD
from megatron.varlen_training.moe_flops import (
    attention_linear_macs_per_token, dense_mlp_macs_per_token, moe_mlp_macs_per_token,
)
from megatron.varlen_training.window_layers import (
    attention_squared_tokens, hybrid_attention_layers,
)

MAMBA_CONV_WIDTH = 4  # megatron-core's MambaMixer d_conv default
SCAN_MACS_PER_STATE_ENTRY = 3  # decay, update, readout


def mamba_layer_macs(model: ModelConfig) -> dict[str, int]:
    """Multiply-adds of one Mamba layer per token (forward), by part."""
    hybrid = model.hybrid
    h, n = model.hidden_size, hybrid.mamba_state_dim
    d_inner = hybrid.mamba_num_heads_resolved * hybrid.mamba_head_dim
    bc = 2 * hybrid.mamba_num_groups * n
    return {
        "in_proj": h * (2 * d_inner + bc + hybrid.mamba_num_heads_resolved),  # z, x, B, C, dt
        "conv": (d_inner + bc) * MAMBA_CONV_WIDTH,
        "scan": SCAN_MACS_PER_STATE_ENTRY * d_inner * n,
        "out_proj": d_inner * h,
    }


def mamba_macs_per_token(model: ModelConfig) -> int:
    """Multiply-adds of one Mamba layer per token (forward)."""
    return sum(mamba_layer_macs(model).values())


def hybrid_floating_point_operations(model: ModelConfig, seqlen_sum: int,
                                     seqlen_squared_sum: int,
                                     windowed_squared_sum: int | None = None) -> int:
    """Training FLOPs of one global batch of a hybrid model with the given sum(L), sum(L^2)
    and, with a window, the windowed layers' sum of m*(2L - m)."""
    pattern = model.hybrid.hybrid_layer_pattern
    per_token = {ATTENTION: attention_linear_macs_per_token(model),
                 MLP: dense_mlp_macs_per_token(model),
                 MAMBA: mamba_macs_per_token(model)}
    if model.moe is not None:
        per_token[MOE] = moe_mlp_macs_per_token(model)
    linear = (sum(per_token[symbol] for symbol in pattern)
              + model.hidden_size * model.padded_vocab_size)
    q_dim = model.num_attention_heads * model.head_dim  # --kv-channels where given
    attention = q_dim * attention_squared_tokens(model, hybrid_attention_layers(model),
                                                 seqlen_squared_sum, windowed_squared_sum)
    return FORWARD_AND_BACKWARD * MULTIPLY_ADD * (linear * seqlen_sum + attention)
