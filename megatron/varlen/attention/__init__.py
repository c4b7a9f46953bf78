"""THD/SBHD core attention with context parallelism and per-micro-batch CP-group switching."""

from megatron.varlen.attention.core_attention import VarlenCoreAttention, varlen_attention
from megatron.varlen.attention.cp_group import (
    LOCAL_ONLY_CP_GROUP,
    LocalOnlyCPGroup,
    resolve_cp_group,
    swap_attributes,
    use_cp_group,
)
from megatron.varlen.attention.cp_switching import CPSwitchingSelfAttention
from megatron.varlen.attention.te_adapter import get_te_core_attention

__all__ = [
    "LOCAL_ONLY_CP_GROUP",
    "CPSwitchingSelfAttention",
    "LocalOnlyCPGroup",
    "VarlenCoreAttention",
    "get_te_core_attention",
    "resolve_cp_group",
    "swap_attributes",
    "use_cp_group",
    "varlen_attention",
]
