"""Which attention layers of a model attend through ``--window-size``'s sliding window, for
model FLOPs and the packing scheduler's cost model.

A windowed layer's causal attention over L tokens costs m*(2L - m) squared tokens, m =
min(L, LEFT + 1), instead of L^2 (megatron/varlen/scheduling/attention_area.py). The layers are
megatron-core's choice (``is_layer_window_attention`` through ``layer_window``), by 1-based
layer number: a GPT decoder's layers 1..num_layers and its MTP depth d as num_layers + d; a
hybrid stack's attention layers by their position in the pattern.
"""

from __future__ import annotations

from collections.abc import Sequence

from megatron.varlen.attention import layer_window
from megatron.varlen_training.config.model import ATTENTION, ModelConfig


def counted_window(model: ModelConfig) -> int | None:
    """The windowed layers' LEFT (--window-size), or None when no layer's window is bounded."""
    if model.window_size is None or model.window_size[0] < 0:  # -1: unbounded (no window)
        return None
    return model.window_size[0]


def windowed_layer_count(model: ModelConfig, layer_numbers: Sequence[int]) -> int:
    """How many of the attention layers ``layer_numbers`` (1-based) are windowed."""
    if counted_window(model) is None:
        return 0
    return sum(layer_window(model.window_size, model.window_attn_skip_freq, number) is not None
               for number in layer_numbers)


def gpt_attention_layers(model: ModelConfig) -> range:
    """Layer numbers of a GPT decoder's attention layers: every layer."""
    return range(1, model.num_layers + 1)


def hybrid_attention_layers(model: ModelConfig) -> list[int]:
    """Layer numbers of a hybrid stack's attention layers: the pattern's ``*`` positions."""
    return [position + 1 for position, symbol in enumerate(model.hybrid.hybrid_layer_pattern)
            if symbol == ATTENTION]


def attention_squared_tokens(model: ModelConfig, layer_numbers: Sequence[int],
                             seqlen_squared_sum: int, windowed_squared_sum: int | None) -> int:
    """Squared tokens of the attention layers ``layer_numbers`` over a batch: sum L^2 per full
    layer, the windowed sum per windowed layer (exact ints).

    Raises:
        ValueError: windowed layers, but no windowed sum (the data path was not told the window).
    """
    windowed = windowed_layer_count(model, layer_numbers)
    if windowed and windowed_squared_sum is None:
        raise ValueError(f"{windowed} layers attend through --window-size "
                         f"{model.window_size[0]},0 but the batch has no windowed length sum")
    return ((len(layer_numbers) - windowed) * seqlen_squared_sum
            + windowed * (windowed_squared_sum or 0))
