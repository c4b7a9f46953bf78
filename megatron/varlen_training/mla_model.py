"""The multi-latent attention side of the training layer: which megatron-core config class the
model is built from, and its MLA fields, as Megatron-LM's ``core_transformer_config_from_args``
maps them (an ``MLATransformerConfig`` under ``--multi-latent-attention``, its same-named
fields copied from the flags; YaRN's correction range keeps the class's defaults)."""

from __future__ import annotations

from megatron.core.transformer import MLATransformerConfig, TransformerConfig

from megatron.varlen_training.config import MLAConfig


def transformer_config_class(mla: MLAConfig | None) -> type[TransformerConfig]:
    """``MLATransformerConfig`` for an MLA model, else ``TransformerConfig``."""
    return TransformerConfig if mla is None else MLATransformerConfig


def mla_transformer_config(mla: MLAConfig | None, rotary_base: int,
                           rotary_percent: float) -> dict:
    """The MLA fields of the model's config (none without MLA). MLA builds its own RoPE from
    the config's ``rotary_base`` / ``rotary_percent``, which Megatron-LM fills from the flags of
    those names (GPTModel takes them as arguments instead)."""
    if mla is None:
        return {}
    return {
        "rotary_base": rotary_base,
        "rotary_percent": rotary_percent,
        "multi_latent_attention": True,
        "q_lora_rank": mla.q_lora_rank,
        "kv_lora_rank": mla.kv_lora_rank,
        "qk_head_dim": mla.qk_head_dim,
        "qk_pos_emb_head_dim": mla.qk_pos_emb_head_dim,
        "v_head_dim": mla.v_head_dim,
        "rope_type": mla.rope_type,
        "rotary_scaling_factor": mla.rotary_scaling_factor,
        "mscale": mla.mscale,
        "mscale_all_dim": mla.mscale_all_dim,
    }
