"""``MLAConfig``: multi-latent attention's shape and RoPE (Megatron-LM's mla flags,
mla_arguments.py)."""

from __future__ import annotations

from dataclasses import dataclass

from megatron.varlen_training.config.validation import check_ranges


@dataclass(frozen=True)
class MLAConfig:
    """The MLA layers; fields are named as their flags' dests (megatron-core's
    ``MLATransformerConfig`` fields of the same names)."""

    q_lora_rank: int | None
    """Rank of the queries' down-projection; None: queries come from the hidden states."""
    kv_lora_rank: int
    """Rank of the shared key/value latent."""
    qk_head_dim: int
    """Query/key channels per head that RoPE leaves alone."""
    qk_pos_emb_head_dim: int
    """Query/key channels per head that RoPE rotates (one rotated key shared by all heads)."""
    v_head_dim: int
    """Value channels per head."""
    rope_type: str
    """rope or yarn (validation resolved an unset --rope-type to MLA's default, yarn)."""
    rotary_scaling_factor: float
    """YaRN's context stretch factor."""
    mscale: float
    """YaRN's mscale of the rotated channels."""
    mscale_all_dim: float
    """YaRN's mscale of the softmax scale."""

    def __post_init__(self):
        check_ranges(self)

    @property
    def q_head_dim(self) -> int:
        """Channels of a query/key head: plain + rotated."""
        return self.qk_head_dim + self.qk_pos_emb_head_dim
