"""A Hugging Face sliding window <-> our ``--window-size LEFT,0`` / ``--window-attn-skip-freq``.

transformers (5.x ``masking_utils.sliding_window_overlay``) lets query q see key k when
``q - sliding_window < k <= q``: ``sliding_window`` keys, itself included. Ours counts the
EARLIER keys, so ``LEFT = sliding_window - 1``.

Which layers use it, as transformers reads ``config.json``:

* Qwen2/Qwen3: only with ``use_sliding_window`` true; ``layer_types`` names each layer
  (``sliding_attention`` / ``full_attention``), and without it the layers from
  ``max_window_layers`` on are windowed.
* Qwen3-MoE: with ``use_sliding_window`` true, every layer.
* Mistral: ``sliding_window`` alone, on every layer (null: none).
* Llama and DeepSeek-V3 have no window.

This module stays free of megatron-core at import: the flag layer imports it (hf/config.py).
"""

from __future__ import annotations

from typing import NamedTuple

from megatron.varlen_training.hf.config_schema import HFConfigError

SLIDING = "sliding_attention"
FULL = "full_attention"
# What transformers assumes when config.json omits the key (Qwen2Config, MistralConfig, ...).
HF_DEFAULT_SLIDING_WINDOW = 4096
HF_DEFAULT_MAX_WINDOW_LAYERS = 28
MISTRAL_ARCHITECTURE = "MistralForCausalLM"


class WindowStyle(NamedTuple):
    """How an architecture's config.json says its window."""

    switched: bool  # use_sliding_window turns it on (else sliding_window alone)
    per_layer: bool  # layer_types / max_window_layers pick the layers (else every layer)


WINDOW_STYLES = {
    "Qwen2ForCausalLM": WindowStyle(switched=True, per_layer=True),
    "Qwen3ForCausalLM": WindowStyle(switched=True, per_layer=True),
    "Qwen3MoeForCausalLM": WindowStyle(switched=True, per_layer=False),
    MISTRAL_ARCHITECTURE: WindowStyle(switched=False, per_layer=False),
}

Window = tuple  # (window_size (LEFT, 0) or None, window_attn_skip_freq: 0/1 tuple or None)


def parse_window(raw: dict, architecture: str, where: str) -> Window:
    """``(window_size, window_attn_skip_freq)`` of a ``config.json``: ``(None, None)`` without
    a window, ``window_attn_skip_freq`` None when every layer is windowed."""
    style = WINDOW_STYLES.get(architecture)
    layers = raw["num_hidden_layers"]
    used = bool(raw.get("use_sliding_window", False)) if style is None or style.switched \
        else True
    if used and style is None:
        raise HFConfigError(f"{where}: unsupported value use_sliding_window=True for "
                            f"{architecture} (transformers' {architecture} has no window)")
    width = raw.get("sliding_window", HF_DEFAULT_SLIDING_WINDOW) if used else None
    if style is not None and style.per_layer:
        kinds = raw.get("layer_types") or _derived_kinds(raw, width, layers)
        _check_kinds(kinds, layers, where, allowed=(FULL, SLIDING))
        if width is None and SLIDING in kinds:
            raise HFConfigError(f"{where}: layer_types names {SLIDING!r} layers but no "
                                f"window is set (use_sliding_window / sliding_window)")
    else:  # the window, if any, is on every layer; transformers ignores layer_types here
        _check_kinds(raw.get("layer_types") or [FULL] * layers, layers, where, allowed=(FULL,))
        kinds = [SLIDING] * layers
    if width is None:
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
    from megatron.varlen.attention import windowed_layers

    windowed = windowed_layers(window_size, skip_freq, num_layers)
    if not any(windowed):
        return None, None
    return (window_size[0], 0), (None if all(windowed) else tuple(map(int, windowed)))


def windowed_architecture(architecture: str, window: Window, skip_flag: str) -> str:
    """The architecture that exports a run's ``window`` (``architecture`` itself, or Mistral
    for Llama's layer windowed everywhere); HFConfigError where none holds it.
    ``skip_flag``: the run's --window-attn-skip-freq as the command line gives it."""
    window_size, skip_freq = window
    if window_size is None:
        return architecture
    if architecture == "LlamaForCausalLM":
        architecture = MISTRAL_ARCHITECTURE
    style = WINDOW_STYLES.get(architecture)
    family = architecture.removesuffix("ForCausalLM")
    if style is None:
        raise HFConfigError(f"export to Hugging Face: --window-size {window_size[0]},0 is not "
                            f"held by {family} (it has no sliding window); drop --window-size")
    if skip_freq is not None and not style.per_layer:
        raise HFConfigError(
            f"export to Hugging Face: {family} windows every layer or none, not some layers "
            f"only (--window-attn-skip-freq {skip_flag}); Qwen2/Qwen3 (--add-qkv-bias or "
            f"--qk-layernorm without experts) hold a window per layer")
    return architecture


def window_config_json(architecture: str, window: Window, num_layers: int) -> dict:
    """The ``config.json`` keys that give transformers this window ({} without one)."""
    window_size, skip_freq = window
    style = WINDOW_STYLES.get(architecture)
    width = None if window_size is None else window_size[0] + 1
    if style is None:
        return {}
    if not style.switched:
        return {"sliding_window": width}  # null, not absent: absent is transformers' 4096
    if width is None:
        return {}
    keys = {"use_sliding_window": True, "sliding_window": width}
    if style.per_layer:
        kinds = [SLIDING if flag else FULL for flag in skip_freq or (1,) * num_layers]
        keys["layer_types"] = kinds
        leading_full = kinds.index(SLIDING)
        if all(kind == SLIDING for kind in kinds[leading_full:]):
            keys["max_window_layers"] = leading_full  # what readers without layer_types use
    return keys
