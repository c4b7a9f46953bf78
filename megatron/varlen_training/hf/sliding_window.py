"""A Hugging Face sliding window <-> our ``--window-size LEFT,0`` / ``--window-attn-skip-freq``.

transformers (5.x ``masking_utils.sliding_window_overlay``) lets query q see key k when
``q - sliding_window < k <= q``: ``sliding_window`` keys, itself included. Ours counts the
EARLIER keys, so ``LEFT = sliding_window - 1``.

Which layers use it, as transformers reads ``config.json``:

* Qwen2/Qwen3: only with ``use_sliding_window`` true; ``layer_types`` names each layer
  (``sliding_attention`` / ``full_attention``), and without it the layers from
  ``max_window_layers`` on are windowed.
* Mistral: ``sliding_window`` alone, on every layer (null: none).
* Llama, DeepSeek-V3 have no window; Qwen3-MoE's (every layer) is not mapped here.

This module stays free of megatron-core: the flag layer imports it (via hf/config.py).
"""

from __future__ import annotations

from megatron.varlen_training.hf.config_schema import HFConfigError

SLIDING = "sliding_attention"
FULL = "full_attention"
# What transformers assumes when config.json omits the key (Qwen2Config / MistralConfig).
HF_DEFAULT_SLIDING_WINDOW = 4096
HF_DEFAULT_MAX_WINDOW_LAYERS = 28
# How each architecture expresses its window.
PER_LAYER_STYLE = "per_layer"  # use_sliding_window + layer_types (Qwen2, Qwen3)
EVERY_LAYER_STYLE = "every_layer"  # sliding_window on every layer (Mistral)
PER_LAYER_ARCHITECTURES = ("Qwen2ForCausalLM", "Qwen3ForCausalLM")
EVERY_LAYER_ARCHITECTURE = "MistralForCausalLM"

Window = tuple  # (window_size (LEFT, 0) or None, window_attn_skip_freq: 0/1 tuple or None)


def window_style(architecture: str) -> str | None:
    if architecture in PER_LAYER_ARCHITECTURES:
        return PER_LAYER_STYLE
    return EVERY_LAYER_STYLE if architecture == EVERY_LAYER_ARCHITECTURE else None


def parse_window(raw: dict, architecture: str, where: str) -> Window:
    """``(window_size, window_attn_skip_freq)`` of a ``config.json``: ``(None, None)`` without
    a window, ``window_attn_skip_freq`` None when every layer is windowed."""
    style = window_style(architecture)
    layers = raw["num_hidden_layers"]
    if style == EVERY_LAYER_STYLE:
        width = raw.get("sliding_window", HF_DEFAULT_SLIDING_WINDOW)
        kinds = [SLIDING] * layers
        _check_kinds(raw.get("layer_types") or [FULL] * layers, layers, where,
                     allowed=(FULL,))  # transformers' Mistral ignores layer_types
    else:
        used = bool(raw.get("use_sliding_window", False))
        if used and style is None:
            raise HFConfigError(f"{where}: unsupported value use_sliding_window=True for "
                                f"{architecture} (transformers' {architecture} has no window)")
        width = raw.get("sliding_window", HF_DEFAULT_SLIDING_WINDOW) if used else None
        kinds = raw.get("layer_types") or _derived_kinds(raw, width, layers)
        _check_kinds(kinds, layers, where, allowed=(FULL, SLIDING) if style else (FULL,))
    if width is None:
        if SLIDING in kinds and style != EVERY_LAYER_STYLE:
            raise HFConfigError(f"{where}: layer_types names {SLIDING!r} layers but no "
                                f"window is set (use_sliding_window / sliding_window)")
        return None, None
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise HFConfigError(f"{where}: sliding_window {width!r} must be a positive integer")
    windowed = tuple(int(kind == SLIDING) for kind in kinds)
    if not any(windowed):
        return None, None
    return (width - 1, 0), (None if all(windowed) else windowed)


def _derived_kinds(raw: dict, width: int | None, layers: int) -> list[str]:
    """transformers' layer_types when config.json has none: windowed from max_window_layers."""
    first = raw.get("max_window_layers", HF_DEFAULT_MAX_WINDOW_LAYERS)
    return [SLIDING if width is not None and layer >= first else FULL for layer in range(layers)]


def _check_kinds(kinds, layers: int, where: str, allowed: tuple[str, ...]) -> None:
    if len(kinds) != layers or any(kind not in allowed for kind in kinds):
        raise HFConfigError(f"{where}: unsupported layer_types {list(kinds)!r} (needs "
                            f"{layers} entries of {', '.join(map(repr, allowed))})")


def model_window(window_size, skip_freq, num_layers: int) -> Window:
    """A run's window as :func:`parse_window` gives it: ``(None, None)`` where no layer attends
    through a bounded window, a 0/1 tuple only where some layer does not."""
    # Imported here: the flag layer imports this module and stays free of megatron-core.
    from megatron.varlen.attention.sliding_window import windowed_layers

    choice = list(skip_freq) if isinstance(skip_freq, tuple) else skip_freq  # mcore: a list
    windowed = windowed_layers(window_size, choice, num_layers)
    if not any(windowed):
        return None, None
    return (window_size[0], 0), (None if all(windowed) else tuple(map(int, windowed)))


def window_config_json(architecture: str, window_size, skip_freq, num_layers: int) -> dict:
    """The ``config.json`` keys that give transformers this window ({} without one)."""
    width = None if window_size is None else window_size[0] + 1
    if window_style(architecture) == EVERY_LAYER_STYLE:
        return {"sliding_window": width}  # null, not absent: absent is transformers' 4096
    if width is None:
        return {}
    windowed = skip_freq or (1,) * num_layers
    kinds = [SLIDING if flag else FULL for flag in windowed]
    keys = {"use_sliding_window": True, "sliding_window": width, "layer_types": kinds}
    leading_full = kinds.index(SLIDING)
    if all(kind == SLIDING for kind in kinds[leading_full:]):
        keys["max_window_layers"] = leading_full  # what readers without layer_types use
    return keys
