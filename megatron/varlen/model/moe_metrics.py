"""The MoE losses an iteration reports, with Megatron-LM's names, reduced once per step.

Every router adds, per layer and loss, a weighted sum and its weight (seq_aux_loss: each
sequence's loss times its real length, and the length, counted on one rank per sequence; the
z-loss: per-token terms and the token count). At the end of a step one SUM all-reduce over
every rank gives, per layer, the token-weighted mean over the global batch -- a number packing
and CP layout cannot change when the loss itself is per sequence or per token -- and the report
is the mean over the MoE layers (Megatron-LM averages over MoE layers too).
"""

from __future__ import annotations

import torch

# Megatron-LM's metric names, by --moe-router-load-balancing-type (and the z-loss).
METRIC_NAMES = {"aux_loss": "load_balancing_loss", "seq_aux_loss": "seq_load_balancing_loss",
                "global_aux_loss": "global_load_balancing_loss"}
Z_LOSS = "z_loss"
# Megatron-LM's per-layer key (track_moe_metrics with --moe-per-layer-logging); ``index`` counts
# from 0 over the decoder layers, then the MTP layers, dense ones included (they write 0).
PER_LAYER_NAME = "moe/{name}_layer_{index}"

_TRACKER: dict[str, dict[int, torch.Tensor]] = {}  # name -> layer number -> [weighted, weight]


def record(name: str, layer_number: int | None, weighted: torch.Tensor, weight) -> None:
    """Adds ``weighted`` (detached) and ``weight`` to the layer's entry of ``name``."""
    if layer_number is None:
        return
    entry = _TRACKER.setdefault(name, {}).get(layer_number)
    pair = torch.stack([weighted.detach().float().reshape(()),
                        torch.as_tensor(weight, dtype=torch.float32, device=weighted.device)])
    _TRACKER[name][layer_number] = pair if entry is None else entry + pair


def clear() -> None:
    _TRACKER.clear()


def reduce_and_clear(names: list[str], num_layers: int, device,
                     per_layer: bool = False) -> dict[str, float]:
    """The step's value of each of ``names`` (every rank calls it: one all-reduce).

    ``num_layers`` bounds the layer numbers (decoder plus MTP layers). A name no MoE layer
    recorded on any rank is left out. ``per_layer``: also each layer's value of each reported
    name (:data:`PER_LAYER_NAME`), 0 for a layer that recorded none (a dense layer), as
    Megatron-LM's tracker holds a zero for it.
    """
    table = torch.zeros(len(names), num_layers, 2, dtype=torch.float64, device=device)
    for row, name in enumerate(names):
        for layer_number, pair in _TRACKER.get(name, {}).items():
            table[row, min(layer_number, num_layers) - 1] += pair.to(table)
    clear()
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(table)
    values = {}
    for row, name in enumerate(names):
        weights = table[row, :, 1]
        layers = weights > 0
        if layers.any():
            # A layer without weight divides by 1 (its sum is 0): 0, never 0 / 0.
            per_layer_values = table[row, :, 0] / torch.where(layers, weights,
                                                              torch.ones_like(weights))
            values[name] = per_layer_values[layers].mean().item()
            if per_layer:
                values.update({PER_LAYER_NAME.format(name=name, index=index): value
                               for index, value in enumerate(per_layer_values.tolist())})
    return values
