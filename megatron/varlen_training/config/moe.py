"""``MoEConfig``: the Mixture-of-Experts layers (Megatron-LM's MoE flags, moe_arguments.py)."""

from __future__ import annotations

from dataclasses import dataclass

from megatron.varlen.model import moe_layer_pattern
from megatron.varlen_training.config.validation import check_ranges

NO_LOAD_BALANCING = "none"
GLOBAL_AUX_LOSS = "global_aux_loss"
DEFAULT_BIAS_UPDATE_RATE = 1e-3  # Megatron-LM's --moe-router-bias-update-rate
DEFAULT_DROP_POLICY = "probs"  # Megatron-LM's --moe-token-drop-policy


@dataclass(frozen=True)
class MoEConfig:
    """The MoE layers; fields are named as their flags' dests, defaults resolved by validation
    (``moe_token_dispatcher_type``, ``expert_tensor_parallel_size``)."""

    num_experts: int
    moe_router_topk: int
    moe_ffn_hidden_size: int | None
    moe_shared_expert_intermediate_size: int | None
    moe_layer_freq: int | tuple[int, ...]
    expert_model_parallel_size: int
    expert_tensor_parallel_size: int
    moe_router_load_balancing_type: str
    moe_aux_loss_coeff: float
    moe_z_loss_coeff: float | None
    moe_router_score_function: str
    moe_router_pre_softmax: bool
    moe_router_topk_scaling_factor: float | None
    moe_token_dispatcher_type: str
    moe_router_dtype: str | None
    moe_expert_capacity_factor: float | None
    # Router options with Megatron-LM's defaults (a config built without them routes as before).
    moe_router_enable_expert_bias: bool = False
    moe_router_bias_update_rate: float = DEFAULT_BIAS_UPDATE_RATE
    moe_router_num_groups: int | None = None
    moe_router_group_topk: int | None = None
    moe_shared_expert_overlap: bool = False
    moe_token_drop_policy: str = DEFAULT_DROP_POLICY
    moe_pad_expert_input_to_capacity: bool = False

    def __post_init__(self):
        check_ranges(self)

    @property
    def layer_freq(self) -> int | list[int]:
        """``--moe-layer-freq`` as megatron-core's TransformerConfig takes it."""
        freq = self.moe_layer_freq
        return freq if isinstance(freq, int) else list(freq)

    def is_moe_layer(self, num_layers: int) -> list[bool]:
        """Which of the ``num_layers`` decoder layers are MoE layers."""
        return moe_layer_pattern(self.layer_freq, num_layers)

    def mtp_layers_are_moe(self, num_layers: int) -> bool:
        """Whether the MTP layers have MoE MLPs: Megatron-LM builds them from the last decoder
        layer's spec, so they follow that layer's entry of ``--moe-layer-freq``."""
        return self.is_moe_layer(num_layers)[-1]

    @property
    def balancing_loss(self) -> str | None:
        """The load-balancing loss that trains (None when the type is none or its weight 0)."""
        if self.moe_router_load_balancing_type == NO_LOAD_BALANCING:
            return None
        return self.moe_router_load_balancing_type if self.moe_aux_loss_coeff > 0 else None

    @property
    def depends_on_microbatch_order(self) -> bool:
        """Whether the order of a step's micro-batches changes the trained model:
        ``global_aux_loss`` balances against the running average of the counts of the step's
        micro-batches so far (Megatron-LM's definition), so the pipeline's reordering must
        not apply to it."""
        return self.balancing_loss == GLOBAL_AUX_LOSS
