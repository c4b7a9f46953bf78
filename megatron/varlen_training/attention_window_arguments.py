"""Megatron-LM's sliding-window attention flags: ``--window-size`` and ``--window-attn-skip-freq``.

``--window-size W,0`` (Megatron-LM's tuple syntax, ``(W,0)`` too) becomes
``TransformerConfig.window_size``: a query sees the W keys before it and itself. Our attentions
are causal, so the right side must be 0 (Megatron-LM's local attention would let a query see
later keys with another value; Transformer Engine overrides it for causal masks): one line
otherwise. ``--window-attn-skip-freq`` picks the windowed layers as megatron-core does (an int
N: every N-th layer attends fully; a 0/1 list or pattern per layer, 1 = windowed), parsed like
``--moe-layer-freq``. Every attention backend here honours both
(:mod:`megatron.varlen.attention.sliding_window`).
"""

from __future__ import annotations

import argparse

from megatron.varlen_training.flag_ranges import layer_pattern_problem
from megatron.varlen_training.moe_arguments import layer_freq_type

WINDOW_FLAG = "--window-size"
SKIP_FREQ_FLAG = "--window-attn-skip-freq"
UNBOUNDED = -1  # Megatron-LM's "no limit on this side"


def parse_window_size(text) -> tuple[int, ...]:
    """``W,0`` or ``(W,0)`` -> (W, 0), as Megatron-LM's ``tuple_type`` reads it; a config tree
    (megatron.wrap) may give the list ``[W, 0]`` (or its JSON text)."""
    if isinstance(text, (list, tuple)):
        if all(type(side) is int for side in text):
            return tuple(text)
        text = ",".join(map(str, text))
    try:
        return tuple(int(part) for part in str(text).strip().strip("()[]").split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{WINDOW_FLAG} {text!r}: give two ints LEFT,RIGHT, e.g. 4096,0") from None


def add_window_args(parser: argparse.ArgumentParser) -> None:
    """Registers Megatron-LM's two sliding-window flags."""
    group = parser.add_argument_group("Sliding-window attention (Megatron-LM's flags)")
    group.add_argument(WINDOW_FLAG, type=parse_window_size, default=None,
                       help="Sliding-window attention LEFT,0: a query sees the LEFT keys before "
                            "it and itself (Hugging Face's sliding_window is LEFT + 1); the "
                            "right side must be 0 (causal). Default: the whole causal context.")
    group.add_argument(SKIP_FREQ_FLAG, type=layer_freq_type(SKIP_FREQ_FLAG), default=None,
                       help="Which layers use the window: an int N leaves every N-th layer on "
                            "full attention; a 0/1 list or pattern such as ([1]*3+[0]*1)*2 "
                            "marks windowed layers with 1. Default: every layer.")


def validate_window_args(args: argparse.Namespace, require) -> None:
    """One line for a window the attentions cannot run, or a layer choice that does not fit
    the model (``require(cond, message)``)."""
    window, freq = args.window_size, args.window_attn_skip_freq
    if window is not None:  # the library checks the same (sliding_window.py) for its callers
        require(len(window) == 2, f"{WINDOW_FLAG} {_text(window)}: give two ints LEFT,RIGHT")
        require(window[0] >= UNBOUNDED,
                f"{WINDOW_FLAG} {_text(window)}: left {window[0]} must be >= 0 (or -1: "
                f"unbounded)")
        require(window[1] == 0, f"{WINDOW_FLAG} {_text(window)}: right {window[1]} must be 0 "
                                f"(the attention is causal: a query sees no later key)")
    require(freq is None or window is not None,
            f"{SKIP_FREQ_FLAG} picks the layers of a sliding window: it needs {WINDOW_FLAG}")
    if isinstance(freq, int):
        require(freq >= 1, f"{SKIP_FREQ_FLAG} {freq} must be >= 1")
    elif freq is not None:
        problem = layer_pattern_problem(SKIP_FREQ_FLAG, freq, args.num_layers)
        require(problem is None, problem)
        # megatron-core numbers an MTP depth's layer num_layers + depth: a per-layer list has
        # no entry for it (an IndexError inside megatron-core's attention).
        require(not args.mtp_num_layers,
                f"{SKIP_FREQ_FLAG} as a per-layer list has no entry for the "
                f"--mtp-num-layers {args.mtp_num_layers} layers (megatron-core numbers them "
                f"after the decoder's): give an int, or drop --mtp-num-layers")


def _text(window) -> str:
    return ",".join(str(side) for side in window) if window is not None else "None"
