"""The losses an iteration reports beside ``lm loss``, with Megatron-LM's names: the MoE
balancing losses (``seq_load_balancing_loss``, ``z_loss``, ...; per layer with
``--moe-per-layer-logging``) and the multi-token-prediction losses (``mtp_1 loss``, ...).

Each is token-weighted over the global batch (megatron/varlen/model/moe_metrics.py and
mtp_metrics.py), so packing and CP layout do not change it. Every rank calls
:func:`step_losses` once per step (all-reduces); the last rank, which logs, gets the values.
"""

from __future__ import annotations

from megatron.core import parallel_state
from megatron.varlen_training import moe_model
from megatron.varlen_training.config import LoggingConfig, ModelConfig
from megatron.varlen_training.iteration_metrics import is_scalar_only_key, mtp_loss_name
from megatron.varlen.model import mtp_metrics


def mtp_step_losses(mtp_num_layers: int | None, device) -> dict[str, float]:
    """Each MTP depth's loss per loss token of the step (``mtp_1 loss``, ...), reduced over
    the data-parallel x context-parallel group: its ranks hold disjoint tokens, while the TP
    ranks of a group each hold the whole loss. Empty without MTP, and on the ranks that hold
    no MTP layer (pipeline stages before the last)."""
    if not mtp_num_layers:
        return {}
    group = parallel_state.get_data_parallel_group(with_context_parallel=True)
    values = mtp_metrics.reduce_and_clear(mtp_num_layers, device, group)
    return {mtp_loss_name(depth): value for depth, value in enumerate(values, start=1)
            if value is not None}


def step_losses(model: ModelConfig, logging: LoggingConfig,
                device) -> tuple[dict[str, float], dict[str, float]]:
    """``(line losses, scalar-only values)`` of the step: the MoE and MTP losses the iteration
    line prints, and the per-layer MoE losses only TensorBoard, wandb and the JSONL get."""
    moe = moe_model.step_losses(model.moe, model.num_layers, model.mtp_num_layers, device,
                                per_layer=logging.moe_per_layer_logging)
    line = {key: value for key, value in moe.items() if not is_scalar_only_key(key)}
    scalars = {key: value for key, value in moe.items() if is_scalar_only_key(key)}
    line.update(mtp_step_losses(model.mtp_num_layers, device))
    return line, scalars
