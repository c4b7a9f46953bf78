"""The MoE side of the training layer: the run's MoE config as megatron-core's TransformerConfig
fields, and the balancing losses an iteration reports (Megatron-LM's names)."""

from __future__ import annotations

from megatron.varlen_training.config import MoEConfig
from megatron.varlen_training.iteration_metrics import LOSS_KEYS
from megatron.varlen_training.moe_arguments import ALLTOALL
from megatron.varlen.model import moe_metrics


def moe_transformer_config(moe: MoEConfig | None) -> dict:
    """TransformerConfig keyword arguments of the MoE layers (a dense model: the dispatcher only,
    which megatron-core checks even without experts: its default, allgather, is rejected
    together with variable_seq_lengths)."""
    if moe is None:
        return {"moe_token_dispatcher_type": ALLTOALL}
    balancing = moe.moe_router_load_balancing_type
    return {
        "num_moe_experts": moe.num_experts,
        "moe_router_topk": moe.moe_router_topk,
        "moe_ffn_hidden_size": moe.moe_ffn_hidden_size,
        "moe_shared_expert_intermediate_size": moe.moe_shared_expert_intermediate_size,
        "moe_layer_freq": moe.layer_freq,
        "expert_model_parallel_size": moe.expert_model_parallel_size,
        "expert_tensor_parallel_size": moe.expert_tensor_parallel_size,
        "moe_router_load_balancing_type": balancing,
        "moe_aux_loss_coeff": moe.moe_aux_loss_coeff,
        "moe_z_loss_coeff": moe.moe_z_loss_coeff,
        "moe_router_score_function": moe.moe_router_score_function,
        "moe_router_pre_softmax": moe.moe_router_pre_softmax,
        "moe_router_topk_scaling_factor": moe.moe_router_topk_scaling_factor,
        "moe_token_dispatcher_type": moe.moe_token_dispatcher_type,
        "moe_router_dtype": moe.moe_router_dtype,
        "moe_expert_capacity_factor": moe.moe_expert_capacity_factor,
        "moe_router_enable_expert_bias": moe.moe_router_enable_expert_bias,
        "moe_router_bias_update_rate": moe.moe_router_bias_update_rate,
        "moe_router_num_groups": moe.moe_router_num_groups,
        "moe_router_group_topk": moe.moe_router_group_topk,
        "moe_shared_expert_overlap": moe.moe_shared_expert_overlap,
        "moe_token_drop_policy": moe.moe_token_drop_policy,
        "moe_pad_expert_input_to_capacity": moe.moe_pad_expert_input_to_capacity,
        "moe_grouped_gemm": False,  # plain-torch SequentialMLP experts (no TE, runs on CPU)
    }


def reported_losses(moe: MoEConfig | None) -> list[str]:
    """Megatron-LM's names of the losses this run's routers record, in report order."""
    if moe is None:
        return []
    names = []
    if moe.balancing_loss is not None:
        names.append(moe_metrics.METRIC_NAMES[moe.balancing_loss])
    if moe.moe_z_loss_coeff is not None:
        names.append(moe_metrics.Z_LOSS)
    return [name for name in LOSS_KEYS if name in names]


def step_losses(moe: MoEConfig | None, num_layers: int, mtp_num_layers: int | None,
                device, per_layer: bool = False) -> dict[str, float]:
    """The step's balancing losses (every rank calls it: one all-reduce), then cleared;
    ``per_layer`` (--moe-per-layer-logging): also each layer's (moe_metrics.PER_LAYER_NAME)."""
    names = reported_losses(moe)
    if not names:
        return {}
    return moe_metrics.reduce_and_clear(names, num_layers + (mtp_num_layers or 0), device,
                                        per_layer=per_layer)
