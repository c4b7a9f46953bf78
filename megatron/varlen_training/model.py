"""Builds the GPT model chunks (one per virtual pipeline stage), initialised and DDP-wrapped."""

from __future__ import annotations

import torch

from megatron.core import parallel_state
from megatron.core.activations import squared_relu
# Megatron-LM's (and megatron-core's MLP checks compare against this one, not activations')
from megatron.core.fusions.fused_bias_geglu import quick_gelu
from megatron.core.distributed import DistributedDataParallel
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.enums import AttnBackend
from megatron.core.transformer.module import Float16Module
from megatron.varlen_training.config import ModelConfig, RunConfig
from megatron.varlen_training.ddp_settings import core_ddp_config
from megatron.varlen_training.errors import agree_on_errors
from megatron.varlen_training.layout_invariant_init import initialize_layout_invariant
from megatron.varlen_training.log import print_rank_0
from megatron.varlen_training.varlen_arguments import precision_dtype
from megatron.varlen.model import (
    VarlenGPTModel, get_varlen_decoder_block_spec, get_varlen_moe_block_spec,
    get_varlen_mtp_block_spec, load_layer_spec, with_moe_mlp,
)
from megatron.varlen_training.mla_model import mla_transformer_config, transformer_config_class
from megatron.varlen_training.moe_model import moe_transformer_config
from megatron.varlen.platform import (
    TE_KERNELS, describe_attention_backend, get_device, resolve_attention_backend,
    use_bias_dropout_add_fusion, use_cpu,
)
from megatron.varlen.platform import te_checkpoint_stand_in


def params_dtype(model: ModelConfig) -> torch.dtype:
    return precision_dtype(model.bf16, model.fp16)


def attention_backend(model: ModelConfig) -> str:
    """The core attention the run uses: --attention-backend resolved for its dtype, dropout and
    softmax (validation resolved it once already, so it raises nothing here)."""
    return resolve_attention_backend(model.attention_backend, params_dtype(model),
                                     model.attention_dropout, model.softmax_type)


def attention_backend_line(model: ModelConfig) -> str:
    """Start-up log text: the backend, the flag, and (auto) why flash was passed over."""
    return describe_attention_backend(model.attention_backend, params_dtype(model),
                                      model.attention_dropout, model.softmax_type)


def mlp_activation(model: ModelConfig):
    """The MLP activation, as Megatron-LM's core_transformer_config_from_args picks it: SiLU
    (gated) with --swiglu, megatron-core's squared_relu with --squared-relu, its quick_gelu
    (gated) with --quick-geglu, else GELU."""
    if model.swiglu:
        return torch.nn.functional.silu
    if model.quick_geglu:
        return quick_gelu
    return squared_relu if model.squared_relu else torch.nn.functional.gelu


def per_layer_choice(skip_freq):
    """A per-layer choice (``--window-attn-skip-freq``, ``--no-rope-freq``) as megatron-core
    reads it: an int, or a LIST (a tuple is refused by its ``is_layer_window_attention``)."""
    return list(skip_freq) if isinstance(skip_freq, tuple) else skip_freq


def build_transformer_config(run: RunConfig) -> TransformerConfig:
    """Maps the run's model and parallel layout to megatron-core's TransformerConfig."""
    model, parallel, kernels = run.model, run.parallel, run.model.kernels
    dtype = params_dtype(model)
    return transformer_config_class(model.mla)(
        num_layers=model.num_layers,
        hidden_size=model.hidden_size,
        ffn_hidden_size=model.ffn_hidden_size,
        num_attention_heads=model.num_attention_heads,
        num_query_groups=model.num_query_groups,
        kv_channels=model.kv_channels,
        layernorm_epsilon=model.norm_epsilon,
        layernorm_zero_centered_gamma=model.layernorm_zero_centered_gamma,
        add_qkv_bias=model.add_qkv_bias,
        qk_layernorm=model.qk_layernorm,
        hidden_dropout=model.hidden_dropout,
        attention_dropout=model.attention_dropout,
        attention_softmax_in_fp32=model.attention_softmax_in_fp32,
        apply_query_key_layer_scaling=model.apply_query_key_layer_scaling,
        init_method_std=model.init_method_std,
        normalization=model.normalization,
        gated_linear_unit=model.gated_mlp,
        activation_func=mlp_activation(model),
        glu_linear_offset=model.glu_linear_offset,
        activation_func_clamp_value=model.activation_func_clamp_value,
        window_size=model.window_size,
        softmax_type=model.softmax_type,
        no_rope_freq=per_layer_choice(model.no_rope_freq),
        window_attn_skip_freq=per_layer_choice(model.window_attn_skip_freq),
        add_bias_linear=not model.disable_bias_linear,
        tensor_model_parallel_size=parallel.tensor_model_parallel_size,
        pipeline_model_parallel_size=parallel.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=parallel.virtual_pipeline_model_parallel_size,
        num_layers_in_first_pipeline_stage=parallel.decoder_first_pipeline_num_layers,
        num_layers_in_last_pipeline_stage=parallel.decoder_last_pipeline_num_layers,
        account_for_embedding_in_pipeline_split=parallel.account_for_embedding_in_pipeline_split,
        account_for_loss_in_pipeline_split=parallel.account_for_loss_in_pipeline_split,
        pipeline_model_parallel_layout=parallel.pipeline_model_parallel_layout,
        microbatch_group_size_per_vp_stage=parallel.microbatch_group_size_per_vp_stage,
        context_parallel_size=parallel.context_parallel_size,
        sequence_parallel=parallel.sequence_parallel,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=model.bf16,
        fp16=model.fp16,
        calculate_per_token_loss=run.training.calculate_per_token_loss,
        deterministic_mode=run.runtime.deterministic_mode,
        use_cpu_initialization=True,
        # Megatron-LM: under VPP p2p overlaps compute (--no-overlap-p2p-communication: batched
        # instead); overlap_p2p_comm is resolved False without VPP. gloo: batched
        # isend/irecv gave silently wrong gradients with VPP (found while building the VPP
        # path), so CPU runs send p2p messages one at a time.
        overlap_p2p_comm=parallel.overlap_p2p_comm,
        batch_p2p_comm=not (parallel.overlap_p2p_comm or use_cpu()),
        variable_seq_lengths=run.packing.variable_seq_lengths,
        **moe_transformer_config(model.moe),
        **mla_transformer_config(model.mla, model.rotary_base, model.rotary_percent),
        gradient_accumulation_fusion=False,
        # CUDA only, only where there is something to fuse, and only where the compiled kernel
        # gives the unfused numbers (probed); never with --no-bias-dropout-fusion.
        bias_dropout_fusion=kernels.bias_dropout_fusion and use_bias_dropout_add_fusion(
            model.hidden_dropout, not model.disable_bias_linear),
        apply_rope_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        cross_entropy_loss_fusion=kernels.cross_entropy_loss_fusion,
        cross_entropy_fusion_impl=kernels.cross_entropy_fusion_impl,
        disable_bf16_reduced_precision_matmul=kernels.disable_bf16_reduced_precision_matmul,
        transformer_impl=kernels.transformer_impl,
        moe_permute_fusion=kernels.moe_permute_fusion,
        moe_router_fusion=kernels.moe_router_fusion,
        # Megatron-LM's [] (no CUDA graphs here): megatron-core's default "full" ends as []
        # too, after a deprecation warning on every build.
        cuda_graph_scope=[],
        # Megatron-LM's fused / unfused hold TE to that kernel (megatron-core's LanguageModule
        # sets NVTE_*_ATTN from this field); any other choice leaves TE its own pick.
        attention_backend=(AttnBackend[model.attention_backend]
                           if model.attention_backend in TE_KERNELS else AttnBackend.auto),
        mtp_num_layers=model.mtp_num_layers,
        mtp_loss_scaling_factor=model.mtp_loss_scaling_factor,
        recompute_granularity=model.recompute_granularity,
        recompute_method=model.recompute_method,
        recompute_num_layers=model.recompute_num_layers,
        recompute_modules=list(model.recompute_modules),
    )


def _decoder_specs(run: RunConfig, config, vp_stage: int | None):
    """(decoder block spec, MTP block spec or None) of this stage: MoE layers where
    --moe-layer-freq says; an MTP layer is built like the LAST decoder layer (Megatron-LM's
    gpt_builders), so it is dense when --moe-layer-freq makes that layer dense."""
    model = run.model
    layer_spec = load_layer_spec(model.spec, model.normalization, attention_backend(model),
                                 qk_layernorm=model.qk_layernorm,
                                 multi_latent_attention=model.mla is not None)
    if model.moe is None:
        block = get_varlen_decoder_block_spec(config, layer_spec, vp_stage)
    else:
        block = get_varlen_moe_block_spec(config, layer_spec, vp_stage)
        if model.moe.mtp_layers_are_moe(model.num_layers):
            layer_spec = with_moe_mlp(layer_spec)
    mtp_spec = (get_varlen_mtp_block_spec(config, layer_spec, vp_stage=vp_stage)
                if config.mtp_num_layers else None)
    return block, mtp_spec


def _build_chunk(run: RunConfig, config, vp_stage: int | None) -> VarlenGPTModel:
    model = run.model
    kwargs = {} if vp_stage is None else {"ignore_virtual": False, "vp_stage": vp_stage}
    block_spec, mtp_spec = _decoder_specs(run, config, vp_stage)
    return VarlenGPTModel(
        config=config,
        transformer_layer_spec=block_spec,
        mtp_block_spec=mtp_spec,
        vocab_size=model.padded_vocab_size,
        max_sequence_length=model.max_position_embeddings,
        pre_process=parallel_state.is_pipeline_first_stage(**kwargs),
        post_process=parallel_state.is_pipeline_last_stage(**kwargs),
        share_embeddings_and_output_weights=model.tied_output,
        position_embedding_type=model.position_embedding_type,
        rotary_base=model.rotary_base,
        rotary_percent=model.rotary_percent,
        seq_len_interpolation_factor=model.rotary_seq_len_interpolation_factor,
        rope_scaling=model.use_rope_scaling,
        rope_scaling_factor=model.rope_scaling_factor,
        vp_stage=vp_stage,
    )


def build_model(run: RunConfig, config: TransformerConfig, build_chunk=None,
                import_weights=None) -> list[DistributedDataParallel]:
    """GPT chunks for this rank (several with VPP), layout-invariantly initialised, in DDP.

    ``build_chunk(run, config, vp_stage)`` builds one chunk (default: a GPT chunk; the hybrid
    model family passes its own). ``import_weights(chunks)`` overwrites the initial weights
    before the chunks move to the device (a Hugging Face checkpoint: model_family.py).
    """
    build_chunk = build_chunk or _build_chunk
    model = run.model
    te_checkpoint_stand_in.install()  # --recompute-modules layernorm without TE
    stages = run.parallel.virtual_pipeline_model_parallel_size
    print_rank_0(f"> attention backend: {attention_backend_line(model)}; on {get_device().type}")
    chunks = [build_chunk(run, config, vp) for vp in (range(stages) if stages else [None])]
    initialize_layout_invariant(
        chunks, seed=run.training.seed, std=model.init_method_std, num_layers=model.num_layers,
        tied_output=model.tied_output, gated_mlp=model.gated_mlp, hybrid=config.is_hybrid_model)
    if import_weights is not None:  # a rank's slice may be missing or misshapen: agree
        agree_on_errors(import_weights, chunks)
    # Built and initialised on the host (use_cpu_initialization: the same weights on any
    # device), then moved once to where training runs; DDP buffers and optimizer state follow.
    chunks = [chunk.to(get_device()) for chunk in chunks]
    if model.bf16 or model.fp16:
        # As Megatron-LM: cast every module (our plain-torch norms too) to the half dtype and
        # convert inputs/outputs at the model boundary.
        chunks = [Float16Module(config, chunk) for chunk in chunks]
    # Megatron-LM sizes --ddp-num-buckets by the rank's parameters over all its chunks.
    num_parameters = sum(p.nelement() for chunk in chunks for p in chunk.parameters())
    ddp_config = core_ddp_config(run, num_parameters)
    return [
        DistributedDataParallel(config, ddp_config, chunk, disable_bucketing=index > 0)
        for index, chunk in enumerate(chunks)
    ]


def unwrap(model_chunk: torch.nn.Module) -> VarlenGPTModel:
    """The GPTModel inside a DDP wrapper."""
    while hasattr(model_chunk, "module"):
        model_chunk = model_chunk.module
    return model_chunk
