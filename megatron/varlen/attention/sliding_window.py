"""Sliding-window attention: which layers attend through a window, and how wide it is.

megatron-core's ``TransformerConfig.window_size = (left, right)`` (Megatron-LM's
``--window-size``) lets query position i see keys ``i - left .. i + right`` of its sequence,
-1 meaning unbounded; ``window_attn_skip_freq`` (``--window-attn-skip-freq``) picks the layers
that use it: every layer (None), all but every N-th (an int N), or a 0/1 list per layer (1 =
windowed). That choice is megatron-core's own :func:`is_layer_window_attention`, used here too,
so every backend windows the same layers.

The attentions here are causal, so only ``right == 0`` is meaningful (the key can never be
after the query); ``left`` is the number of EARLIER keys a query sees, itself included it sees
``left + 1`` (Hugging Face's ``sliding_window``). Positions are within a sequence: packing and
the CP split move rows, never a sequence's positions, so the window is the same on every layout.
"""

from __future__ import annotations

from typing import Optional, Sequence

from megatron.core.transformer.utils import is_layer_window_attention

UNBOUNDED = -1  # megatron-core's (and FlashAttention's) "no limit on this side"


def check_window_size(window_size: Optional[Sequence[int]]) -> Optional[str]:
    """The problem with a ``window_size`` for causal attention, or None when it is usable."""
    if window_size is None:
        return None
    if len(window_size) != 2 or any(isinstance(v, bool) or not isinstance(v, int)
                                    for v in window_size):
        return f"window_size {tuple(window_size)} must be two ints (left, right)"
    left, right = window_size
    if left < UNBOUNDED:
        return f"window_size left {left} must be >= 0 (or -1: unbounded)"
    if right != 0:
        return (f"window_size right {right} must be 0: the attention is causal, a query sees "
                f"no later key")
    return None


def layer_window(window_size: Optional[Sequence[int]], skip_freq, layer_number: int
                 ) -> Optional[int]:
    """The left window of layer ``layer_number`` (1-based), or None where it attends to its
    whole causal context (no window, a skipped layer, or an unbounded left side).
    ``skip_freq`` may be the run config's frozen 0/1 tuple (megatron-core takes a list).

    Raises:
        ValueError: an unusable window (:func:`check_window_size`).
    """
    problem = check_window_size(window_size)
    if problem is not None:
        raise ValueError(problem)
    choice = list(skip_freq) if isinstance(skip_freq, tuple) else skip_freq
    if not is_layer_window_attention(window_size and tuple(window_size), choice, layer_number):
        return None
    left = window_size[0]
    return None if left == UNBOUNDED else left


def windowed_layers(window_size: Optional[Sequence[int]], skip_freq, num_layers: int
                    ) -> list[bool]:
    """For each of ``num_layers`` layers (1-based numbers 1..num_layers), whether it attends
    through a bounded window."""
    return [layer_window(window_size, skip_freq, number) is not None
            for number in range(1, num_layers + 1)]
