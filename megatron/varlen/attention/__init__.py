"""THD/SBHD core attention with context parallelism and per-micro-batch CP-group switching.

Backends: :class:`VarlenCoreAttention` (plain-torch reference), :class:`FlashVarlenCoreAttention`
(torch's FlashAttention varlen kernel, laid out by an :class:`AttentionPlan`), TE's attention
(:func:`get_te_core_attention`); the sliding window's layers and width (:func:`layer_window`).
"""

from megatron.varlen.attention.attention_plan import AttentionPlan, build_attention_plan
from megatron.varlen.attention.core_attention import VarlenCoreAttention, varlen_attention
from megatron.varlen.attention.cp_group import (
    LOCAL_ONLY_CP_GROUP,
    LocalOnlyCPGroup,
    resolve_cp_group,
    swap_attributes,
    use_cp_group,
)
from megatron.varlen.attention.cp_switching import CPSwitchingSelfAttention
from megatron.varlen.attention.flash_attention import FlashVarlenCoreAttention
from megatron.varlen.attention.sliding_window import (
    check_window_size,
    layer_window,
    windowed_layers,
)
from megatron.varlen.attention.te_adapter import get_te_core_attention

__all__ = [
    "AttentionPlan",
    "FlashVarlenCoreAttention",
    "LOCAL_ONLY_CP_GROUP",
    "CPSwitchingSelfAttention",
    "LocalOnlyCPGroup",
    "VarlenCoreAttention",
    "build_attention_plan",
    "check_window_size",
    "get_te_core_attention",
    "layer_window",
    "resolve_cp_group",
    "swap_attributes",
    "use_cp_group",
    "varlen_attention",
    "windowed_layers",
]
