"""Builds the GPT model chunks (one per virtual pipeline stage), initialised and DDP-wrapped."""

from __future__ import annotations

import torch

from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.module import Float16Module
from megatron.varlen_training.hf.importer import load_hf_weights
from megatron.varlen_training.layout_invariant_init import initialize_layout_invariant
from megatron.varlen_training.log import print_rank_0
from megatron.varlen_training.varlen_arguments import attention_backend, attention_backend_line
from megatron.varlen.platform import get_device, use_bias_dropout_add_fusion, use_cpu
from megatron.varlen_training.run_description import padded_vocab_size  # noqa: F401 (public here)
from megatron.varlen.model import (
    VarlenGPTModel, get_varlen_decoder_block_spec, get_varlen_mtp_block_spec, load_layer_spec,
)


def params_dtype(args) -> torch.dtype:
    if args.bf16:
        return torch.bfloat16
    return torch.float16 if args.fp16 else torch.float32


def build_transformer_config(args) -> TransformerConfig:
    """Maps the parsed flags to megatron-core's TransformerConfig."""
    dtype = params_dtype(args)
    return TransformerConfig(
        num_layers=args.num_layers,
        hidden_size=args.hidden_size,
        ffn_hidden_size=args.ffn_hidden_size,
        num_attention_heads=args.num_attention_heads,
        num_query_groups=args.num_query_groups,
        kv_channels=args.kv_channels,
        layernorm_epsilon=args.norm_epsilon,
        add_qkv_bias=args.add_qkv_bias,
        qk_layernorm=args.qk_layernorm,
        hidden_dropout=args.hidden_dropout,
        attention_dropout=args.attention_dropout,
        init_method_std=args.init_method_std,
        normalization=args.normalization,
        gated_linear_unit=args.swiglu,
        activation_func=torch.nn.functional.silu if args.swiglu else torch.nn.functional.gelu,
        add_bias_linear=not args.disable_bias_linear,
        tensor_model_parallel_size=args.tensor_model_parallel_size,
        pipeline_model_parallel_size=args.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=args.virtual_pipeline_model_parallel_size,
        context_parallel_size=args.context_parallel_size,
        sequence_parallel=args.sequence_parallel,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=args.bf16,
        fp16=args.fp16,
        calculate_per_token_loss=args.calculate_per_token_loss,
        use_cpu_initialization=True,
        # gloo: batched isend/irecv gave silently wrong gradients with VPP (found while
        # building the VPP path), so CPU runs send p2p messages one at a time.
        batch_p2p_comm=not use_cpu(),
        variable_seq_lengths=getattr(args, "variable_seq_lengths", False),
        # Unused by dense models, but megatron-core rejects its default ("allgather") together
        # with variable_seq_lengths even when there are no experts.
        moe_token_dispatcher_type="alltoall",
        gradient_accumulation_fusion=False,
        # CUDA only, only where there is something to fuse, and only where the compiled kernel
        # gives the unfused numbers (probed).
        bias_dropout_fusion=use_bias_dropout_add_fusion(args.hidden_dropout,
                                                        not args.disable_bias_linear),
        apply_rope_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        mtp_num_layers=getattr(args, "mtp_num_layers", None),
    )


def _build_chunk(args, config, vp_stage: int | None) -> VarlenGPTModel:
    kwargs = {} if vp_stage is None else {"ignore_virtual": False, "vp_stage": vp_stage}
    layer_spec = load_layer_spec(args.spec, args.normalization, attention_backend(args),
                                 qk_layernorm=args.qk_layernorm)
    mtp_spec = (get_varlen_mtp_block_spec(config, layer_spec, vp_stage=vp_stage)
                if config.mtp_num_layers else None)
    return VarlenGPTModel(
        config=config,
        transformer_layer_spec=get_varlen_decoder_block_spec(config, layer_spec, vp_stage),
        mtp_block_spec=mtp_spec,
        vocab_size=args.padded_vocab_size,
        max_sequence_length=args.max_position_embeddings,
        pre_process=parallel_state.is_pipeline_first_stage(**kwargs),
        post_process=parallel_state.is_pipeline_last_stage(**kwargs),
        share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
        position_embedding_type=args.position_embedding_type,
        rotary_base=args.rotary_base,
        rope_scaling=args.use_rope_scaling,
        rope_scaling_factor=args.rope_scaling_factor,
        vp_stage=vp_stage,
    )


def build_model(args, config: TransformerConfig,
                build_chunk=None) -> list[DistributedDataParallel]:
    """GPT chunks for this rank (several with VPP), layout-invariantly initialised, in DDP.

    ``build_chunk(args, config, vp_stage)`` builds one chunk (default: a GPT chunk; the hybrid
    entry point passes its own).
    """
    build_chunk = build_chunk or _build_chunk
    # args.padded_vocab_size was derived once, at validation (run_description.py).
    stages = args.virtual_pipeline_model_parallel_size
    print_rank_0(f"> attention backend: {attention_backend_line(args)}; on {get_device().type}")
    chunks = [build_chunk(args, config, vp) for vp in (range(stages) if stages else [None])]
    initialize_layout_invariant(
        chunks, seed=args.seed, std=args.init_method_std, num_layers=args.num_layers,
        tied_output=not args.untie_embeddings_and_output_weights, gated_mlp=args.swiglu)
    if args.hf_checkpoint:
        load_hf_weights(chunks, args.hf_checkpoint,
                        tied_output=not args.untie_embeddings_and_output_weights)
    # Built and initialised on the host (use_cpu_initialization: the same weights on any
    # device), then moved once to where training runs; DDP buffers and optimizer state follow.
    chunks = [chunk.to(get_device()) for chunk in chunks]
    if args.bf16 or args.fp16:
        # As Megatron-LM: cast every module (our plain-torch norms too) to the half dtype and
        # convert inputs/outputs at the model boundary.
        chunks = [Float16Module(config, chunk) for chunk in chunks]
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        use_distributed_optimizer=args.use_distributed_optimizer,
        overlap_grad_reduce=False,
    )
    return [
        DistributedDataParallel(config, ddp_config, chunk, disable_bucketing=index > 0)
        for index, chunk in enumerate(chunks)
    ]


def unwrap(model_chunk: torch.nn.Module) -> VarlenGPTModel:
    """The GPTModel inside a DDP wrapper."""
    while hasattr(model_chunk, "module"):
        model_chunk = model_chunk.module
    return model_chunk
