"""Which decoder layers are Mixture-of-Experts layers: the one rule, torch-free, for the model's
spec (moe_spec.py) and the flag layer (megatron.varlen_training.config.moe) alike."""

from __future__ import annotations

from collections.abc import Sequence


def moe_layer_pattern(moe_layer_freq: int | Sequence[int], num_layers: int) -> list[bool]:
    """Which of ``num_layers`` decoder layers are MoE: every ``freq``-th from the first (an
    int) or a 0/1 list (``--moe-layer-freq``, Megatron-LM's meaning)."""
    if isinstance(moe_layer_freq, int):
        return [index % moe_layer_freq == 0 for index in range(num_layers)]
    if len(moe_layer_freq) != num_layers:
        raise ValueError(f"--moe-layer-freq lists {len(moe_layer_freq)} layers but the model "
                         f"has {num_layers} (--num-layers)")
    return [bool(flag) for flag in moe_layer_freq]
