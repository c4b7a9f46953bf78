"""The hybrid Mamba-Transformer model family of pretrain_mamba.py: its chunks and ``HYBRID``.

Everything but the chunk itself is GPT's: ``build_model`` pads the vocabulary, initialises the
weights layout-invariantly (Mamba mixer rules in ``varlen/mamba/init.py``), wraps in
Float16Module/DDP. The config is GPT's TransformerConfig plus the Mamba fields.
"""

from __future__ import annotations

import dataclasses

from megatron.core import parallel_state
from megatron.core.transformer import TransformerConfig
from megatron.varlen_training.config import HybridConfig, RunConfig
from megatron.varlen_training.config.model import ATTENTION, MAMBA, MLP, MOE
from megatron.varlen_training.hybrid_flops import hybrid_floating_point_operations
from megatron.varlen_training.model import build_model, build_transformer_config
from megatron.varlen_training.model_family import ModelFamily
from megatron.varlen_training.window_layers import hybrid_attention_layers
from megatron.varlen.mamba import VarlenMambaModel, get_varlen_hybrid_stack_spec


def build_hybrid_config(run: RunConfig) -> TransformerConfig:
    """GPT's TransformerConfig with the Mamba dimensions set, marked ``is_hybrid_model`` as
    Megatron-LM marks a hybrid run (``--is-hybrid-model``; on main any layer pattern): its
    output projections then start from std / sqrt(num_layers), not / sqrt(2 num_layers)."""
    hybrid = run.model.hybrid
    return dataclasses.replace(
        build_transformer_config(run),
        is_hybrid_model=True,
        output_layer_init_method=None,  # re-derived by __post_init__ for the hybrid model
        mamba_state_dim=hybrid.mamba_state_dim,
        mamba_head_dim=hybrid.mamba_head_dim,
        mamba_num_groups=hybrid.mamba_num_groups,
        mamba_num_heads=hybrid.mamba_num_heads_resolved,
    )


def build_hybrid_chunk(run: RunConfig, config: TransformerConfig, vp_stage) -> VarlenMambaModel:
    """One hybrid model chunk for this pipeline stage (no virtual stages: validation refuses)."""
    assert vp_stage is None, "the hybrid stack has no virtual pipeline stages"
    model = run.model
    return VarlenMambaModel(
        config=config,
        mamba_stack_spec=get_varlen_hybrid_stack_spec(),
        vocab_size=model.padded_vocab_size,
        max_sequence_length=model.max_position_embeddings,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        hybrid_override_pattern=model.hybrid.hybrid_layer_pattern,
        share_embeddings_and_output_weights=model.tied_output,
        position_embedding_type=model.position_embedding_type,
        rotary_base=model.rotary_base,
        rotary_percent=model.rotary_percent,
        seq_len_interpolation_factor=model.rotary_seq_len_interpolation_factor,
    )


def describe_hybrid_model(hybrid: HybridConfig) -> str:
    """The start-up line pretrain_mamba.py prints (rank 0): layer pattern and Mamba sizes."""
    pattern = hybrid.hybrid_layer_pattern
    return (f"> hybrid layer pattern {pattern}: {pattern.count(MAMBA)} Mamba, "
            f"{pattern.count(ATTENTION)} attention, {pattern.count(MLP)} MLP, "
            f"{pattern.count(MOE)} MoE layers; "
            f"{hybrid.mamba_num_heads_resolved} Mamba heads of dim {hybrid.mamba_head_dim}, state "
            f"{hybrid.mamba_state_dim}, {hybrid.mamba_num_groups} groups")


def hybrid_model_provider(run: RunConfig):
    """(config, DDP-wrapped chunks): the model provider of the hybrid family."""
    config = build_hybrid_config(run)
    return config, build_model(run, config, build_chunk=build_hybrid_chunk)


# No Hugging Face adapter: pretrain_mamba.py refuses --hf-checkpoint and --save-hf.
# Only the attention layers are quadratic: the cost model weighs them by their share.
HYBRID = ModelFamily(name="hybrid Mamba-Transformer", model_provider=hybrid_model_provider,
                     flops=hybrid_floating_point_operations,
                     attention_layers=hybrid_attention_layers,
                     describe=lambda model: describe_hybrid_model(model.hybrid))
