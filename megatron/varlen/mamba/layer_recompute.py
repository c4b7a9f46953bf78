"""Full activation recomputation for the hybrid stack (megatron-core's ``MambaStack`` has none).

With ``recompute_granularity == "full"`` a training forward runs the stack's layers the way
megatron-core's ``TransformerBlock._checkpointed_forward`` runs a GPT block, with the same
config fields: ``uniform`` checkpoints groups of ``recompute_num_layers`` consecutive layers,
``block`` checkpoints the first ``recompute_num_layers`` layers (one at a time) and runs the rest
normally. Each group goes through ``tensor_parallel.checkpoint``, which keeps only its input and
restores the RNG states (CPU, CUDA, tracker) before running the group again in backward.

What the recomputed forward must see besides the tensors -- the micro-batch's
``packed_seq_params`` (its CP group, boundaries and the per-micro-batch cache of attention plans
and Mamba permutations) and an unpacked micro-batch's ``padding_mask`` (its MoE routers count
real tokens only; without it a recomputed router counted padding: grad norm 53% off) -- is
bound into each group's function when the group is built, never
read from the stack or a module attribute at recompute time: with a pipeline schedule the
backward of micro-batch k runs after the forward of micro-batch k+1, and every per-call CP swap
(attention, Mamba mixer) is undone when its forward returns.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from megatron.core import tensor_parallel
from megatron.core.transformer.transformer_layer import TransformerLayer

FULL, UNIFORM, BLOCK = "full", "uniform", "block"


def _run_layer(layer, hidden_states, attention_mask, rotary_pos_emb, packed_seq_params,
               padding_mask):
    """One hybrid layer as ``MambaStack.forward`` calls it in training (no inference state)."""
    if isinstance(layer, TransformerLayer):
        hidden_states = layer(hidden_states=hidden_states, attention_mask=attention_mask,
                              inference_context=None, rotary_pos_emb=rotary_pos_emb,
                              sequence_len_offset=None, packed_seq_params=packed_seq_params,
                              padding_mask=padding_mask)
    else:  # MambaLayer
        hidden_states = layer(hidden_states=hidden_states, attention_mask=attention_mask,
                              inference_context=None, packed_seq_params=packed_seq_params)
    # Attention layers return (hidden_states, context); the stack keeps the hidden states.
    return hidden_states[0] if isinstance(hidden_states, tuple) else hidden_states


def layer_group(layers: Sequence[Any], packed_seq_params: Any,
                padding_mask: Any = None) -> Callable:
    """``fn(hidden_states, attention_mask, rotary_pos_emb)`` running ``layers`` in order on
    this micro-batch's ``packed_seq_params`` and ``padding_mask`` (bound now: see the module
    docstring)."""
    def run(hidden_states, attention_mask, rotary_pos_emb):
        for layer in layers:
            hidden_states = _run_layer(layer, hidden_states, attention_mask, rotary_pos_emb,
                                       packed_seq_params, padding_mask)
        return hidden_states
    return run


def recomputed_groups(num_layers: int, method: str, count: int) -> list[tuple[int, int, bool]]:
    """``(start, end, recompute)`` layer ranges of one stack, in order (module docstring)."""
    if method == UNIFORM:
        return [(start, min(start + count, num_layers), True)
                for start in range(0, num_layers, count)]
    if method == BLOCK:
        return [(index, index + 1, index < count) for index in range(num_layers)]
    raise ValueError(f"recompute_method {method!r} is not 'uniform' or 'block'")


def checkpointed_forward(layers: Sequence[Any], config, hidden_states, attention_mask,
                         rotary_pos_emb, packed_seq_params, padding_mask=None):
    """The hybrid layers with full recomputation as ``config`` says; returns the hidden states."""
    groups = recomputed_groups(len(layers), config.recompute_method, config.recompute_num_layers)
    for start, end, recompute in groups:
        run = layer_group(layers[start:end], packed_seq_params, padding_mask)
        if recompute:
            hidden_states = tensor_parallel.checkpoint(
                run, config.distribute_saved_activations, hidden_states, attention_mask,
                rotary_pos_emb)
        else:
            hidden_states = run(hidden_states, attention_mask, rotary_pos_emb)
    return hidden_states
