"""Builds hybrid Mamba-Transformer chunks for pretrain_mamba.py (the model-provider hook).

Everything but the chunk itself is GPT's: ``build_model`` pads the vocabulary, initialises the
weights layout-invariantly (Mamba mixer rules in ``varlen/mamba/init.py``), wraps in
Float16Module/DDP. The config is GPT's TransformerConfig plus the Mamba fields.
"""

from __future__ import annotations

import dataclasses

from megatron.core import parallel_state
from megatron.core.transformer import TransformerConfig
from megatron.varlen_training.model import build_model, build_transformer_config
from megatron.varlen.mamba import VarlenMambaModel, get_varlen_hybrid_stack_spec


def build_hybrid_config(args) -> TransformerConfig:
    """GPT's TransformerConfig with the Mamba dimensions set."""
    return dataclasses.replace(
        build_transformer_config(args),
        mamba_state_dim=args.mamba_state_dim,
        mamba_head_dim=args.mamba_head_dim,
        mamba_num_groups=args.mamba_num_groups,
        mamba_num_heads=args.mamba_num_heads_resolved,
    )


def build_hybrid_chunk(args, config: TransformerConfig, vp_stage) -> VarlenMambaModel:
    """One hybrid model chunk for this pipeline stage (no virtual stages: validation refuses)."""
    assert vp_stage is None, "the hybrid stack has no virtual pipeline stages"
    return VarlenMambaModel(
        config=config,
        mamba_stack_spec=get_varlen_hybrid_stack_spec(),
        vocab_size=args.padded_vocab_size,
        max_sequence_length=args.max_position_embeddings,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        hybrid_override_pattern=args.hybrid_layer_pattern,
        share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
        position_embedding_type=args.position_embedding_type,
        rotary_base=args.rotary_base,
    )


def hybrid_model_provider(args):
    """(config, DDP-wrapped chunks): the model provider pretrain_mamba.py hands to pretrain()."""
    config = build_hybrid_config(args)
    return config, build_model(args, config, build_chunk=build_hybrid_chunk)
