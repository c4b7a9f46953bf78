"""Model FLOPs of one training step from the REAL sequence lengths of the global batch.

Token-linear work scales with sum(L); causal core attention with sum(L^2). Counting from padded
lengths (as upstream Megatron-LM does with packed sequences) overstates throughput; sums are
exact Python ints. A sequence is what attends as one: a packed sample, or with documents
inside pretraining samples each document (packed pieces, or the unpacked path's
``--reset-attention-mask``; datasets/documents.py), so sum(L^2) runs over documents, not over
``--seq-length`` samples.

Per layer and token (forward, multiply-add = 2 FLOPs): QKV 2*h*(q + 2*kv), output projection
2*q*h, MLP 2*h*f*(2 if gated else 1) + 2*f*h (an MoE layer: router and the ACTIVATED experts,
moe_flops.py). Per sequence of length L, causal attention forward:
QK^T and AV over the lower triangle, 2 * 2*q*L^2/2 = 2*q*L^2; a layer that attends through
--window-size's window LEFT = w: 2*q*m*(2L - m), m = min(L, w + 1), the work it does (its
windowed sum, window_layers.py; Megatron-LM counts full attention). Logits: 2*h*V per token.
Multi-latent attention (--multi-latent-attention): its projections and its query/key and value
widths instead, as Megatron-LM's MLA branch counts them (mla_flops.py).
Multi-token prediction (--mtp-num-layers D), counted as Megatron-LM counts it: each depth is one
more transformer layer (its linear and causal-attention terms) plus, per token, its eh
projection 2*2h*h, its norms 2*3h and the output layer again 2*h*V.
Training = forward + backward = 3x forward.
"""

from __future__ import annotations

from megatron.varlen_training.config import ModelConfig
from megatron.varlen_training.mla_flops import core_attention_flops_per_squared_token
from megatron.varlen_training.moe_flops import (
    attention_linear_macs_per_token, decoder_mlp_macs_per_token, dense_mlp_macs_per_token,
    moe_mlp_macs_per_token,
)
from megatron.varlen_training.window_layers import attention_squared_tokens

FORWARD_AND_BACKWARD = 3
MULTIPLY_ADD = 2
# An MTP depth's norms (its two input norms and its final norm, h multiply-adds per token
# each): Megatron-LM's FLOPs count them, the only elementwise work it counts.
MTP_NORMS = 3


def _mtp_macs_per_token(model: ModelConfig, layer_macs: int) -> int:
    """Multiply-adds per token of the MTP depths beyond their layers' attention (forward): one
    transformer layer, the eh projection [2h -> h], the norms and the output layer each."""
    h = model.hidden_size
    per_depth = layer_macs + 2 * h * h + MTP_NORMS * h + h * model.padded_vocab_size
    return (model.mtp_num_layers or 0) * per_depth


def _linear_flops_per_token(model: ModelConfig) -> int:
    attention = attention_linear_macs_per_token(model)
    # an MTP depth's layer is built like the last decoder layer (model.py, as Megatron-LM)
    mtp_is_moe = model.moe is not None and model.moe.mtp_layers_are_moe(model.num_layers)
    mtp_mlp = moe_mlp_macs_per_token(model) if mtp_is_moe else dense_mlp_macs_per_token(model)
    logits = model.hidden_size * model.padded_vocab_size
    return MULTIPLY_ADD * (model.num_layers * attention + decoder_mlp_macs_per_token(model)
                           + logits + _mtp_macs_per_token(model, attention + mtp_mlp))


def num_floating_point_operations(model: ModelConfig, seqlen_sum: int, seqlen_squared_sum: int,
                                  windowed_squared_sum: int | None = None) -> int:
    """Training FLOPs of one global batch of a GPT model with the given sum(L) and sum(L^2),
    and the windowed layers' sum of m*(2L - m) with a window (hybrid models: hybrid_flops.py;
    the model family picks, model_family.py)."""
    # each MTP depth attends, as layer num_layers + depth
    layers = range(1, model.num_layers + (model.mtp_num_layers or 0) + 1)
    attention = core_attention_flops_per_squared_token(model) * attention_squared_tokens(
        model, layers, seqlen_squared_sum, windowed_squared_sum)
    linear = _linear_flops_per_token(model) * seqlen_sum
    return FORWARD_AND_BACKWARD * (linear + attention)
