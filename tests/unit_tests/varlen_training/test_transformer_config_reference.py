"""The same command line builds the same megatron-core TransformerConfig as Megatron-LM's.

Reference: :func:`megatron_lm_config`, written in this test from facts read off Megatron-LM
core_v0.16.1 (``megatron/training/arguments.py``: the flag defaults, ``validate_args``'s
derivations and ``core_transformer_config_from_args``, which copies every flag named like a
TransformerConfig field and then sets ``pipeline_dtype``, the activation, ``num_query_groups``
and ``num_moe_experts``). It never calls our flag layer. Fields where we differ on purpose are
listed in :data:`DIFFERENT_ON_PURPOSE` with the reason: none of them changes the numbers.

This caught --attention-softmax-in-fp32 (Megatron-LM's default False; megatron-core's field
default True was left in place) and --apply-query-key-layer-scaling (unknown here).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from megatron.core.activations import squared_relu
from megatron.core.fusions.fused_bias_geglu import quick_gelu
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.flag_errors import ArgumentValidationError
from megatron.varlen_training.hybrid_arguments import build_hybrid_parser
from megatron.varlen_training.model import build_transformer_config

# Megatron-LM core_v0.16.1's defaults of the flags the command lines below set (argparse dests).
MEGATRON_LM_DEFAULTS = {
    "ffn_hidden_size": None, "group_query_attention": False, "num_query_groups": 1,
    "kv_channels": None, "norm_epsilon": 1e-5, "add_qkv_bias": False, "qk_layernorm": False,
    "hidden_dropout": 0.1, "attention_dropout": 0.1, "init_method_std": 0.02,
    "normalization": "LayerNorm", "swiglu": False, "squared_relu": False,
    "window_size": None, "window_attn_skip_freq": None,
    "quick_geglu": False, "glu_linear_offset": 0.0, "activation_func_clamp_value": None,
    "softmax_type": "vanilla", "no_rope_freq": None,
    "disable_bias_linear": False,
    "attention_softmax_in_fp32": False, "apply_query_key_layer_scaling": False,
    "bf16": False, "fp16": False, "tensor_model_parallel_size": 1,
    "pipeline_model_parallel_size": 1, "context_parallel_size": 1, "sequence_parallel": False,
    "calculate_per_token_loss": False, "mtp_num_layers": None, "mtp_loss_scaling_factor": 0.1,
    "num_experts": None, "moe_router_topk": 2, "moe_ffn_hidden_size": None,
    "moe_shared_expert_intermediate_size": None, "moe_layer_freq": 1,
    "moe_router_load_balancing_type": "aux_loss", "moe_aux_loss_coeff": 0.0,
    "moe_z_loss_coeff": None, "moe_router_score_function": "softmax",
    "moe_router_pre_softmax": False, "moe_router_topk_scaling_factor": None,
    "moe_router_dtype": None, "moe_expert_capacity_factor": None,
    "moe_token_drop_policy": "probs", "moe_pad_expert_input_to_capacity": False,
    "moe_router_enable_expert_bias": False, "moe_router_bias_update_rate": 1e-3,
    "expert_model_parallel_size": 1, "expert_tensor_parallel_size": None,
    "moe_router_num_groups": None, "moe_router_group_topk": None,
    "moe_shared_expert_overlap": False,
    # Kernel flags (kernel_arguments.py): the --no-*-fusion switches' dests default on.
    "position_embedding_type": "learned_absolute", "use_rotary_position_embeddings": False,
    "masked_softmax_fusion": True, "bias_gelu_fusion": True, "bias_swiglu_fusion": True,
    "bias_dropout_fusion": True, "apply_rope_fusion": True,
    "gradient_accumulation_fusion": True, "no_persist_layer_norm": False,
    "cross_entropy_loss_fusion": False, "cross_entropy_fusion_impl": "native",
    "disable_bf16_reduced_precision_matmul": False, "transformer_impl": "transformer_engine",
    "moe_grouped_gemm": False, "moe_permute_fusion": False, "moe_router_fusion": False,
    "layernorm_zero_centered_gamma": False, "deterministic_mode": False,
    "decoder_first_pipeline_num_layers": None, "decoder_last_pipeline_num_layers": None,
    "account_for_embedding_in_pipeline_split": False,
    "account_for_loss_in_pipeline_split": False, "num_virtual_stages_per_pipeline_rank": None,
    "num_layers_per_virtual_pipeline_stage": None, "overlap_p2p_comm": True,
    # The mla group (and --rope-type, --rotary-base, --rotary-percent, which MLA's config reads).
    "multi_latent_attention": False, "q_lora_rank": None, "kv_lora_rank": 32,
    "qk_head_dim": 128, "qk_pos_emb_head_dim": 64, "v_head_dim": 128,
    "rotary_scaling_factor": 1.0, "mscale": 1.0, "mscale_all_dim": 0.0, "rope_type": None,
    "rotary_base": 10000, "rotary_percent": 1.0,
    "pipeline_model_parallel_layout": None, "microbatch_group_size_per_vp_stage": None,
}
# MLATransformerConfig fields core_transformer_config_from_args copies from same-named flags.
_MLA_COPIED = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim",
               "v_head_dim", "rotary_scaling_factor", "mscale", "mscale_all_dim", "rotary_base",
               "rotary_percent")
# MLATransformerConfig's defaults where no flag of that name exists (YaRN's correction range;
# Megatron-LM's --yarn-* flags feed its non-MLA YaRN only) or the flag is unset (rope_type).
MLA_CLASS_DEFAULTS = {"original_max_position_embeddings": 4096, "beta_fast": 32,
                      "beta_slow": 1, "rope_type": "yarn", "cache_mla_latents": False}
# validate_args: the SwiGLU default MLP is 2/3 of 4h, rounded down to this multiple.
SWIGLU_ROUNDING = 64
_MOE_FIELDS = ("moe_router_topk", "moe_shared_expert_intermediate_size", "moe_layer_freq",
               "moe_router_load_balancing_type", "moe_aux_loss_coeff", "moe_z_loss_coeff",
               "moe_router_score_function", "moe_router_pre_softmax",
               "moe_router_topk_scaling_factor", "moe_router_dtype",
               "moe_expert_capacity_factor", "moe_token_drop_policy",
               "moe_pad_expert_input_to_capacity", "moe_router_enable_expert_bias",
               "moe_router_bias_update_rate", "expert_model_parallel_size",
               "moe_router_num_groups", "moe_router_group_topk", "moe_shared_expert_overlap")
_COPIED = ("num_layers", "hidden_size", "num_attention_heads", "add_qkv_bias", "qk_layernorm",
           "hidden_dropout", "attention_dropout", "init_method_std", "normalization",
           "apply_query_key_layer_scaling", "bf16", "fp16", "tensor_model_parallel_size",
           "pipeline_model_parallel_size", "context_parallel_size", "sequence_parallel",
           "calculate_per_token_loss", "mtp_num_layers", "mtp_loss_scaling_factor",
           # --apply-layernorm-1p's dest is the field; the account-for flags are named as theirs
           "layernorm_zero_centered_gamma", "account_for_embedding_in_pipeline_split",
           "account_for_loss_in_pipeline_split", "deterministic_mode")
# Kernel flags core_transformer_config_from_args copies by name (TransformerConfig fields).
_KERNEL_COPIED = ("masked_softmax_fusion", "bias_dropout_fusion", "gradient_accumulation_fusion",
                  "cross_entropy_loss_fusion", "cross_entropy_fusion_impl",
                  "disable_bf16_reduced_precision_matmul", "transformer_impl",
                  "moe_grouped_gemm", "moe_permute_fusion", "moe_router_fusion")


def _default_ffn(flags: dict) -> int:
    hidden = flags["hidden_size"]
    if flags["swiglu"]:
        return int((4 * hidden * 2 / 3) / SWIGLU_ROUNDING) * SWIGLU_ROUNDING
    return 4 * hidden


def _kernel_fields(flags: dict) -> dict:
    """The fusion fields Megatron-LM builds: copied, and as validate_args and
    core_transformer_config_from_args derive them."""
    rope = flags["position_embedding_type"] == "rope" or flags["use_rotary_position_embeddings"]
    gelu_fusion = flags["bias_gelu_fusion"] and not flags["disable_bias_linear"]
    return {
        **{name: flags[name] for name in _KERNEL_COPIED},
        "bias_activation_fusion": (flags["bias_swiglu_fusion"] if flags["swiglu"]
                                   else gelu_fusion),
        "apply_rope_fusion": flags["apply_rope_fusion"] and rope,  # off without rope
        "persist_layer_norm": not flags["no_persist_layer_norm"],
    }


def _expanded_no_rope(flags: dict):
    value = flags["no_rope_freq"]
    if isinstance(value, str):
        return eval(value)  # noqa: S307 (a test: Megatron-LM evaluates the pattern)
    if isinstance(value, int):
        return ([0] * (value - 1) + [1]) * (flags["num_layers"] // value)
    return value


def _virtual_pipeline_size(flags: dict) -> int | None:
    """validate_args: the layout's stages over the PP size, --num-virtual-stages-per-pipeline-rank
    as given, or the layers of a stage (the embedding and the loss counted when asked) over
    --num-layers-per-virtual-pipeline-stage; one virtual stage means none."""
    if flags["pipeline_model_parallel_layout"] is not None:  # its stages over the PP size
        size = (PipelineParallelLayerLayout.get_num_stages_from_str(
            flags["pipeline_model_parallel_layout"]) // flags["pipeline_model_parallel_size"])
    elif flags["num_virtual_stages_per_pipeline_rank"] is not None:
        size = flags["num_virtual_stages_per_pipeline_rank"]
    elif flags["num_layers_per_virtual_pipeline_stage"] is not None:
        layers = (flags["num_layers"] + flags["account_for_embedding_in_pipeline_split"]
                  + flags["account_for_loss_in_pipeline_split"])
        size = (layers // flags["pipeline_model_parallel_size"]
                // flags["num_layers_per_virtual_pipeline_stage"])
    else:
        return None
    return None if size == 1 else size


def megatron_lm_config(given: dict) -> dict:
    """TransformerConfig field -> the value Megatron-LM builds for the flags ``given``."""
    flags = {**MEGATRON_LM_DEFAULTS, **given}
    ffn = flags["ffn_hidden_size"] or _default_ffn(flags)
    dtype = (torch.bfloat16 if flags["bf16"] else torch.float16 if flags["fp16"]
             else torch.float32)
    expected = {name: flags[name] for name in _COPIED}
    expected.update(
        ffn_hidden_size=ffn,
        # GQA: the flag's groups (default 1); without it None, which the config makes one
        # group per head.
        num_query_groups=(flags["num_query_groups"] if flags["group_query_attention"]
                          else flags["num_attention_heads"]),
        kv_channels=flags["kv_channels"] or flags["hidden_size"] // flags["num_attention_heads"],
        layernorm_epsilon=flags["norm_epsilon"],
        add_bias_linear=not flags["disable_bias_linear"],
        gated_linear_unit=flags["swiglu"] or flags["quick_geglu"],
        # --squared-relu, then --quick-geglu replace the activation after --swiglu's (which
        # both exclude)
        activation_func=(squared_relu if flags["squared_relu"] else
                         quick_gelu if flags["quick_geglu"] else
                         F.silu if flags["swiglu"] else F.gelu),
        # TransformerConfig fields Megatron-LM's parser exposes as flags
        glu_linear_offset=flags["glu_linear_offset"],
        activation_func_clamp_value=flags["activation_func_clamp_value"],
        # TransformerConfig turns it on with query-key layer scaling.
        attention_softmax_in_fp32=(flags["attention_softmax_in_fp32"]
                                   or flags["apply_query_key_layer_scaling"]),
        params_dtype=dtype, pipeline_dtype=dtype,
        # core_transformer_config_from_args sets these two from the decoder flags.
        num_layers_in_first_pipeline_stage=flags["decoder_first_pipeline_num_layers"],
        num_layers_in_last_pipeline_stage=flags["decoder_last_pipeline_num_layers"],
        virtual_pipeline_model_parallel_size=_virtual_pipeline_size(flags),
        # TransformerConfig parses the layout string (megatron-core caches the parse per
        # string and PP size: the same object) and defaults the micro-batch group to the PP size
        pipeline_model_parallel_layout=(
            None if flags["pipeline_model_parallel_layout"] is None
            else PipelineParallelLayerLayout.from_str(flags["pipeline_model_parallel_layout"],
                                                      flags["pipeline_model_parallel_size"])),
        microbatch_group_size_per_vp_stage=(flags["microbatch_group_size_per_vp_stage"]
                                            or flags["pipeline_model_parallel_size"]),
        # Refused here, so Megatron-LM's defaults: the same model.
        apply_residual_connection_post_layernorm=False,
        rotary_interleaved=False,
        fp32_residual_connection=False, multi_latent_attention=flags["multi_latent_attention"],
        # --window-size: Megatron-LM's tuple_type; --window-attn-skip-freq: its moe_freq_type
        # (an int, or the list a pattern string evaluates to)
        window_size=(None if flags["window_size"] is None else
                     tuple(int(side) for side in flags["window_size"].strip("()").split(","))),
        window_attn_skip_freq=(eval(flags["window_attn_skip_freq"])  # noqa: S307 (a test)
                               if isinstance(flags["window_attn_skip_freq"], str)
                               else flags["window_attn_skip_freq"]),
        softmax_type=flags["softmax_type"],
        # --no-rope-freq: Megatron-LM's no_rope_freq_type (an int, or a pattern's list);
        # TransformerConfig then expands an int into the per-layer list
        no_rope_freq=_expanded_no_rope(flags),
        attention_output_gate=False, qk_l2_norm=False, qk_clip=False,
        fp8=None, fp4=None,
        # None in the flags; TransformerConfig then uses --init-method-std.
        embedding_init_method_std=flags["init_method_std"],
        moe_input_jitter_eps=None, moe_router_force_load_balancing=False,
        moe_shared_expert_gate=False, moe_apply_probs_on_input=False, moe_latent_size=None,
        # Kernel flags refused here (kernel_arguments.py): Megatron-LM's defaults; its
        # --cuda-graph-scope default [] is the list TransformerConfig makes of its own "full".
        fp8_recipe="delayed", fp8_margin=0, fp8_interval=1, fp8_amax_history_len=1,
        fp8_amax_compute_algo="most_recent", fp8_param=False, fp8_wgrad=True,
        tp_comm_overlap=False,
        cuda_graph_impl="none", cuda_graph_scope=[], enable_cuda_graph=False,
        external_cuda_graph=False,
        num_moe_experts=flags["num_experts"],
        **_kernel_fields(flags),
        moe_layer_recompute=False,
        # validate_args: p2p overlaps compute under VPP only (--no-overlap-p2p-communication).
        overlap_p2p_comm=flags["overlap_p2p_comm"] and _virtual_pipeline_size(flags) is not None,
    )
    if flags["multi_latent_attention"]:  # config_class = MLATransformerConfig
        expected.update(MLA_CLASS_DEFAULTS)
        expected.update({name: flags[name] for name in _MLA_COPIED})
        if flags["rope_type"] is not None:  # else popped: the class's default
            expected["rope_type"] = flags["rope_type"]
    if flags["num_experts"] is not None:
        expected.update({name: flags[name] for name in _MOE_FIELDS})
        expected["moe_ffn_hidden_size"] = flags["moe_ffn_hidden_size"] or ffn
        expected["expert_tensor_parallel_size"] = (flags["expert_tensor_parallel_size"]
                                                   or flags["tensor_model_parallel_size"])
    return expected


# Fields we set otherwise on purpose; none changes the numbers of a step.
DIFFERENT_ON_PURPOSE = {
    "batch_p2p_comm": "gloo sends p2p messages one at a time (batched ones gave wrong VPP "
                      "gradients); on CUDA Megatron-LM's (not overlap_p2p_comm), "
                      "test_ddp_flags.py",
    "use_cpu_initialization": "weights are built on the host, layout-invariantly",
    "deallocate_pipeline_outputs": "megatron-core's default (False) is kept",
    "variable_seq_lengths": "packed micro-batches vary in length",
    "moe_token_dispatcher_type": "alltoall with packing (allgather cannot pack); the same "
                                 "routed tokens",
    "cp_comm_type": "all_gather, the only exchange implemented (others refused)",
    "inference_sampling_seed": "inference only",
}

# Fused kernels Megatron-LM turns on by default and this fork never runs: the field is False
# here, so it is compared only where the command line turns the fusion off (then Megatron-LM's
# is False too); the losses do not depend on it (test_kernel_arguments.py).
UNFUSED_HERE = {
    "gradient_accumulation_fusion": "needs APEX/TE's fused wgrad kernels",
    "bias_dropout_fusion": "fused only where the kernel gives the unfused numbers (CUDA)",
    "masked_softmax_fusion": "our core attentions do their own softmax",
    "apply_rope_fusion": "needs Transformer Engine; the packed RoPE table is used instead",
    "persist_layer_norm": "a fused-kernel option; the plain-torch norm has none",
    "bias_activation_fusion": "fused GELU/SwiGLU kernels are not used (plain torch). NOT the "
                              "same numbers for GELU with biases: Megatron-LM's fused bias-GELU "
                              "is the tanh approximation, ours torch's exact GELU",
    "moe_grouped_gemm": "the experts run as SequentialMLP (one GEMM per expert, the same math)",
}

# GPTModel arguments Megatron-LM's builder (core_v0.16.1 and main gpt_builders.py) leaves out,
# which we pass: the flags then do what their help says (docs/MIGRATING.md).
GPT_MODEL_ARGUMENTS_DIFFERENT = {
    "seq_len_interpolation_factor": "--rotary-seq-len-interpolation-factor is dropped there",
    "rope_scaling_factor": "--rope-scaling-factor is dropped there (GPTModel's 8.0 is used)",
}

TINY = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4}
BASE_ARGV = ["--seq-length", "32", "--lr", "1e-3", "--train-iters", "1", "--mock-data",
             "--vocab-size", "128"]
COMMAND_LINES = {
    "dense": {},
    "gqa_default_groups": {"group_query_attention": True},
    "gqa_two_groups": {"group_query_attention": True, "num_query_groups": 2},
    "swiglu_default_ffn": {"swiglu": True, "hidden_size": 96},
    "llama_like": {"swiglu": True, "ffn_hidden_size": 160, "normalization": "RMSNorm",
                   "disable_bias_linear": True, "norm_epsilon": 1e-6,
                   "untie_embeddings_and_output_weights": True},
    "qwen_like": {"add_qkv_bias": True, "kv_channels": 32, "qk_layernorm": False},
    "qk_layernorm": {"qk_layernorm": True},
    "deterministic": {"deterministic_mode": True},
    "dropout_init": {"hidden_dropout": 0.0, "attention_dropout": 0.25,
                     "init_method_std": 0.006},
    "bf16": {"bf16": True},
    "bf16_softmax_fp32": {"bf16": True, "attention_softmax_in_fp32": True},
    "qk_layer_scaling": {"apply_query_key_layer_scaling": True},
    "parallel": {"tensor_model_parallel_size": 2, "sequence_parallel": True,
                 "pipeline_model_parallel_size": 2},
    "virtual_pipeline": {"num_layers": 4, "pipeline_model_parallel_size": 2,
                         "num_layers_per_virtual_pipeline_stage": 1},
    # one virtual stage per rank is none (Megatron-LM), not a virtual pipeline of size 1
    "virtual_pipeline_one_per_stage": {"num_layers": 4, "pipeline_model_parallel_size": 2,
                                       "num_layers_per_virtual_pipeline_stage": 2},
    "layout_vpp_group": {"num_layers": 6, "pipeline_model_parallel_size": 2,
                         "pipeline_model_parallel_layout": "E|ttt|tt|tL",
                         "microbatch_group_size_per_vp_stage": 4, "global_batch_size": 8},
    "layout_mtp": {"num_layers": 4, "pipeline_model_parallel_size": 2, "mtp_num_layers": 1,
                   "pipeline_model_parallel_layout": "Et*3|tmL"},
    "per_token_loss_mtp": {"calculate_per_token_loss": True, "mtp_num_layers": 1},
    "mtp_loss_weight": {"mtp_num_layers": 2, "mtp_loss_scaling_factor": 0.3},
    "moe": {"num_experts": 4, "moe_router_topk": 2, "disable_bias_linear": True,
            "moe_aux_loss_coeff": 0.01,
            "moe_router_score_function": "sigmoid", "moe_router_enable_expert_bias": True,
            "moe_shared_expert_intermediate_size": 32, "moe_token_dispatcher_type": "alltoall"},
    "moe_own_ffn": {"num_experts": 4, "moe_ffn_hidden_size": 48, "disable_bias_linear": True,
                    "moe_router_topk": 1, "moe_router_pre_softmax": True,
                    "moe_z_loss_coeff": 0.001, "moe_token_dispatcher_type": "alltoall"},
    "layernorm_1p": {"layernorm_zero_centered_gamma": True},
    "layernorm_1p_rmsnorm": {"layernorm_zero_centered_gamma": True, "normalization": "RMSNorm"},
    "uneven_first_last": {"num_layers": 6, "pipeline_model_parallel_size": 4,
                          "decoder_first_pipeline_num_layers": 1,
                          "decoder_last_pipeline_num_layers": 1},
    "uneven_first_vpp": {"num_layers": 6, "pipeline_model_parallel_size": 2,
                         "decoder_first_pipeline_num_layers": 2,
                         "num_virtual_stages_per_pipeline_rank": 2},
    "embedding_in_split_vpp": {"num_layers": 7, "pipeline_model_parallel_size": 2,
                               "account_for_embedding_in_pipeline_split": True,
                               "num_layers_per_virtual_pipeline_stage": 2},
    "embedding_and_loss_in_split": {"num_layers": 6, "pipeline_model_parallel_size": 4,
                                    "account_for_embedding_in_pipeline_split": True,
                                    "account_for_loss_in_pipeline_split": True},
    "moe_grouped_routing": {"num_experts": 4, "disable_bias_linear": True,
                            "moe_router_num_groups": 2, "moe_router_group_topk": 1,
                            "moe_shared_expert_intermediate_size": 32,
                            "moe_shared_expert_overlap": True,
                            "moe_token_dispatcher_type": "alltoall"},
    # Kernel flags (kernel_arguments.py): every fusion turned off, Megatron-LM's way.
    "fusions_off": {"masked_softmax_fusion": False, "bias_gelu_fusion": False,
                    "bias_dropout_fusion": False, "apply_rope_fusion": False,
                    "gradient_accumulation_fusion": False, "no_persist_layer_norm": True,
                    "position_embedding_type": "rope"},
    "swiglu_fusion_off": {"swiglu": True, "bias_swiglu_fusion": False,
                          "cross_entropy_loss_fusion": True, "transformer_impl": "local"},
    "gelu_without_bias": {"disable_bias_linear": True, "bf16": True,
                          "disable_bf16_reduced_precision_matmul": True,
                          "cross_entropy_loss_fusion": True,
                          "cross_entropy_fusion_impl": "native"},
    "rotary_alias": {"use_rotary_position_embeddings": True, "apply_rope_fusion": False},
    # Nemotron-H's MLP (without biases: Megatron-LM's default bias-GELU fusion would make
    # megatron-core refuse squared ReLU with them; here nothing is fused, so both build).
    "squared_relu": {"squared_relu": True, "disable_bias_linear": True,
                     "normalization": "RMSNorm"},
    # gpt-oss's sliding window: every other layer windowed (128 earlier keys), then a
    # per-layer pattern (layer 1 full, layer 2 windowed).
    "sliding_window": {"window_size": "(128,0)", "window_attn_skip_freq": 2,
                       "position_embedding_type": "rope"},
    # gpt-oss's attention: a learned sink per head (the local attention takes it)
    "softmax_learnable": {"softmax_type": "learnable", "attention_dropout": 0.0},
    "softmax_off_by_one": {"softmax_type": "off-by-one"},
    # Llama-4's NoPE layers: every other layer skips RoPE (an int, then the pattern)
    "no_rope_every_other": {"no_rope_freq": 2, "position_embedding_type": "rope"},
    "no_rope_pattern": {"no_rope_freq": "([1]+[0])*1", "position_embedding_type": "rope"},
    "sliding_window_pattern": {"window_size": "64,0", "window_attn_skip_freq": "([0]+[1])*1"},
    # gpt-oss's MLP: quick-GEGLU with a linear offset and a clamp, in the experts
    "quick_geglu": {"quick_geglu": True, "glu_linear_offset": 1.0,
                    "activation_func_clamp_value": 7.0, "num_experts": 4,
                    "disable_bias_linear": True, "bias_gelu_fusion": False},
    "moe_grouped_gemm": {"num_experts": 4, "disable_bias_linear": True,
                         "moe_grouped_gemm": True, "moe_token_dispatcher_type": "alltoall"},
    # Multi-latent attention (mla_arguments.py): Megatron-LM's defaults (rope_type yarn),
    # then a DeepSeek-V3-like shape with query compression and YaRN's scales.
    "mla_defaults": {"multi_latent_attention": True, "position_embedding_type": "rope"},
    "mla_rope": {"multi_latent_attention": True, "kv_lora_rank": 16, "qk_head_dim": 16,
                 "qk_pos_emb_head_dim": 8, "v_head_dim": 12, "rope_type": "rope",
                 "rotary_base": 50000, "position_embedding_type": "rope"},
    "mla_q_lora_yarn": {"multi_latent_attention": True, "q_lora_rank": 24, "kv_lora_rank": 16,
                        "qk_head_dim": 16, "qk_pos_emb_head_dim": 8, "v_head_dim": 16,
                        "rope_type": "yarn", "rotary_scaling_factor": 40.0, "mscale": 0.707,
                        "mscale_all_dim": 0.707, "normalization": "RMSNorm",
                        "qk_layernorm": True, "swiglu": True, "disable_bias_linear": True,
                        "position_embedding_type": "rope"},
}
# Megatron-LM's switches that turn a default-on dest off (store_false): dest -> flag.
OFF_SWITCHES = {"masked_softmax_fusion": "--no-masked-softmax-fusion",
                "bias_gelu_fusion": "--no-bias-gelu-fusion",
                "bias_swiglu_fusion": "--no-bias-swiglu-fusion",
                "bias_dropout_fusion": "--no-bias-dropout-fusion",
                "apply_rope_fusion": "--no-rope-fusion",
                "gradient_accumulation_fusion": "--no-gradient-accumulation-fusion"}


def _argv(flags: dict) -> list[str]:
    argv = list(BASE_ARGV)
    flag_of_dest = {dest: flag for flag, dest in MEGATRON_LM_DESTS.items()}
    for dest, value in flags.items():
        flag = flag_of_dest.get(dest, "--" + dest.replace("_", "-"))
        if value is False and dest in OFF_SWITCHES:
            argv.append(OFF_SWITCHES[dest])
        elif value is True:
            argv.append(flag)
        elif value is not False:
            argv += [flag, str(value)]
    return argv


def _our_config(flags: dict) -> TransformerConfig:
    flags = {**TINY, **flags}
    world = flags.get("tensor_model_parallel_size", 1) * flags.get(
        "pipeline_model_parallel_size", 1)
    run = parse_run_config(_argv(flags), world_size=world)
    return build_transformer_config(run)


@pytest.mark.parametrize("name", sorted(COMMAND_LINES))
def test_transformer_config_equals_megatron_lms(name):
    flags = COMMAND_LINES[name]
    ours = _our_config(flags)
    expected = megatron_lm_config({**TINY, **flags})
    assert not _differing(ours, expected), f"{name}: field: (ours, Megatron-LM's) " \
                                           f"{_differing(ours, expected)}"


def test_mla_builds_megatron_lms_config_class():
    """core_transformer_config_from_args: MLATransformerConfig under --multi-latent-attention
    (its own defaults then apply), TransformerConfig otherwise."""
    from megatron.core.transformer import MLATransformerConfig

    assert type(_our_config(COMMAND_LINES["mla_defaults"])) is MLATransformerConfig
    assert type(_our_config(COMMAND_LINES["dense"])) is TransformerConfig


def _comparable(value):
    """A parsed pipeline layout compares by its chunks' layer types (it has no ``==``)."""
    return value.layout if isinstance(value, PipelineParallelLayerLayout) else value


def _differing(ours: TransformerConfig, expected: dict) -> dict:
    """field: (ours, Megatron-LM's) where they differ, but for a fusion Megatron-LM turns on
    and this fork never runs (UNFUSED_HERE: the field must then be False here)."""
    differing = {field: (getattr(ours, field), value) for field, value in expected.items()
                 if _comparable(getattr(ours, field)) != _comparable(value)
                 and not (field in UNFUSED_HERE and value is True)}
    differing.update({field: (True, expected.get(field)) for field in UNFUSED_HERE
                      if getattr(ours, field)})
    return differing


def _census_table_dests() -> set[str]:
    """The census's refused / unread / no-op flags (megatron_lm_census_flags.py): refused at any
    value but Megatron-LM's default, or changing nothing, so the config keeps megatron-core's
    default for them, as Megatron-LM's does at that value (test_megatron_lm_flag_census.py)."""
    from megatron.varlen_training import megatron_lm_census_flags as census

    tables = (census.REFUSED, census.UNREAD, census.ACCEPTED, census.HYBRID_REFUSED)
    return {row.dest for table in tables for row in table}


def test_every_shared_flag_field_is_in_the_reference():
    """A flag of ours named like a TransformerConfig field is one Megatron-LM copies into the
    config: the reference must say what it builds (or the field be a listed difference)."""
    fields = {field.name for field in dataclasses.fields(TransformerConfig)}
    ours = {action.dest for action in build_hybrid_parser().flag_actions}
    covered = set(megatron_lm_config({**TINY, "num_experts": 2}))
    # Ours too, read elsewhere: hybrid sizes (hybrid_model.py), recomputation
    # (recompute_arguments.py's own tests), the packing budget, the dynamic-CP switch, the
    # attention backend (resolved per device, platform.py), the level-1 timer barrier (a timing
    # switch set on the config with the timers, training.py), the logging switches
    # (logging_arguments.py: megatron-core 0.16.1's model reads neither field; the per-layer
    # MoE losses are written by reported_losses.py, the attention-logit one is refused).
    elsewhere = {"is_hybrid_model", "mamba_state_dim", "mamba_head_dim", "mamba_num_groups",
                 "mamba_num_heads", "recompute_granularity", "recompute_method",
                 "recompute_num_layers", "recompute_modules", "max_seqlen_per_dp_cp_rank",
                 "hybrid_context_parallel", "attention_backend", "barrier_with_L1_time",
                 "moe_per_layer_logging", "log_max_attention_logit"}
    missing = (fields & ours) - covered - set(DIFFERENT_ON_PURPOSE) - set(UNFUSED_HERE) \
        - elsewhere - _census_table_dests()
    assert not missing, sorted(missing)


def test_gpt_model_arguments_equal_megatron_lms():
    """The GPTModel arguments Megatron-LM's builder derives from flags (not config fields):
    --rotary-percent / --rotary-seq-len-interpolation-factor / --rotary-base (RoPE frequencies
    of a head-dimension share at positions divided by the factor: float64 reference),
    --untie-embeddings-and-output-weights, --max-position-embeddings, the padded vocabulary."""
    from tests.harness.multirank import run_distributed

    argv = _argv({**TINY, "position_embedding_type": "rope", "rotary_percent": 0.5,
                  "rotary_seq_len_interpolation_factor": 4, "rotary_base": 500,
                  "untie_embeddings_and_output_weights": True,
                  "max_position_embeddings": 64, "vocab_size": 100})
    built = run_distributed(_built_gpt_facts, 1, args=(argv, 8), timeout_s=120)[0]
    assert built["share_embeddings_and_output_weights"] is False
    assert built["max_sequence_length"] == 64
    assert built["vocab_size"] == 128  # 100 padded to Megatron-LM's multiple of 128 x TP 1
    head_dim, rotated = 64 // 4, 8  # half of the 16 channels of a head
    inv_freq = 1.0 / 500 ** (torch.arange(0, rotated, 2, dtype=torch.float64) / rotated)
    positions = torch.arange(8, dtype=torch.float64) / 4
    angles = torch.outer(positions, inv_freq)
    expected = torch.cat([angles, angles], dim=-1)  # megatron-core's non-interleaved layout
    freqs = built["freqs"]
    assert freqs.shape[-1] == rotated < head_dim
    torch.testing.assert_close(freqs.reshape(8, rotated).double(), expected, rtol=1e-6,
                               atol=1e-6)


def _built_gpt_facts(argv: list[str], seq_len: int) -> dict:
    from megatron.core import parallel_state as ps
    from megatron.varlen_training.initialize import initialize_model_parallel, set_random_seeds
    from megatron.varlen_training.model import build_model, unwrap

    run = parse_run_config(argv, world_size=1)
    initialize_model_parallel(run.parallel)
    set_random_seeds(run.training.seed)
    try:
        gpt = unwrap(build_model(run, build_transformer_config(run))[0])
        return {"freqs": gpt.rotary_pos_emb(seq_len).detach().cpu(),
                "share_embeddings_and_output_weights": gpt.share_embeddings_and_output_weights,
                "max_sequence_length": gpt.max_sequence_length, "vocab_size": gpt.vocab_size}
    finally:
        ps.destroy_model_parallel()


@pytest.mark.parametrize("flag, value", [
    ("--apply-residual-connection-post-layernorm", None),
    ("--use-precision-aware-optimizer", None), ("--main-grads-dtype", "bf16"),
    ("--main-params-dtype", "fp16"), ("--exp-avg-dtype", "bf16"),
    ("--rotary-interleaved", None), ("--init-method-xavier-uniform", None),
    ("--window-size", "(128,4)"),
    ("--window-attn-skip-freq", "2"),
    ("--glu-linear-offset", "1.0"), ("--activation-func-clamp-value", "7"),
    ("--fp8-format", "hybrid"),
    ("--embedding-init-method-std", "0.01"), ("--moe-input-jitter-eps", "0.01"),
])
def test_model_flags_not_honoured_are_refused_in_one_line(flag, value):
    argv = _argv(TINY) + [flag] + ([value] if value is not None else [])
    with pytest.raises(ArgumentValidationError) as err:
        parse_run_config(argv, world_size=1)
    message = str(err.value)
    assert flag in message and "\n" not in message


def test_query_key_layer_scaling_sets_softmax_in_fp32_in_the_run():
    """Megatron-LM's validate_args turns --attention-softmax-in-fp32 on with
    --apply-query-key-layer-scaling (its arguments dump shows it): so does the run's record."""
    run = parse_run_config(_argv({**TINY, "apply_query_key_layer_scaling": True}), world_size=1)
    assert run.model.attention_softmax_in_fp32 is True
    assert parse_run_config(_argv(TINY), world_size=1).model.attention_softmax_in_fp32 is False


def test_query_key_layer_scaling_with_te_needs_its_variable(monkeypatch):
    """megatron-core's TE attention refuses the config (a build traceback) unless
    NVTE_APPLY_QK_LAYER_SCALING agrees with the flag, which Megatron-LM leaves to the user:
    one line here, either way round."""
    from megatron.varlen_training import model_arguments

    monkeypatch.setattr(model_arguments, "attention_backend", lambda args: "te")
    monkeypatch.delenv(model_arguments.TE_QK_SCALING_VARIABLE, raising=False)
    argv = _argv({**TINY, "apply_query_key_layer_scaling": True})
    with pytest.raises(ArgumentValidationError, match="NVTE_APPLY_QK_LAYER_SCALING=1"):
        parse_run_config(argv, world_size=1)
    monkeypatch.setenv(model_arguments.TE_QK_SCALING_VARIABLE, "1")
    assert parse_run_config(argv, world_size=1).model.apply_query_key_layer_scaling
    with pytest.raises(ArgumentValidationError, match="NVTE_APPLY_QK_LAYER_SCALING=0"):
        parse_run_config(_argv(TINY), world_size=1)  # the variable without the flag


def test_rotary_flags_without_rope_are_refused():
    with pytest.raises(ArgumentValidationError, match="--position-embedding-type rope"):
        parse_run_config(_argv({**TINY, "rotary_percent": 0.5}), world_size=1)


def test_save_hf_refuses_partial_rope():
    from megatron.varlen_training.hf.config import HFConfigError, config_from_model

    run = parse_run_config(_argv({**TINY, "position_embedding_type": "rope", "swiglu": True,
                                  "ffn_hidden_size": 128, "normalization": "RMSNorm",
                                  "disable_bias_linear": True, "rotary_percent": 0.5}),
                           world_size=1)
    with pytest.raises(HFConfigError, match="--rotary-percent"):
        config_from_model(run.model)


@pytest.mark.parametrize("flags, expected", [
    ([], False),                                          # fp32: Megatron-LM's False
    (["--bf16"], True),                                   # bf16: always fp32 (validate_args)
    (["--fp16"], False),                                  # fp16: only with the flag
    (["--fp16", "--accumulate-allreduce-grads-in-fp32"], True),
])
def test_gradient_reduction_dtype_is_megatron_lms(monkeypatch, flags, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # --fp16 parses on CPU
    run = parse_run_config(_argv(TINY) + flags, world_size=1)
    assert run.model.accumulate_allreduce_grads_in_fp32 is expected


# pretrain_mamba.py: Megatron-LM's core_v0.16.1 defaults of the Mamba flags, and its mixer's
# expansion (d_inner = 2 x hidden) that sets the head count when --mamba-num-heads is unset.
MAMBA_DEFAULTS = {"mamba_state_dim": 128, "mamba_head_dim": 64, "mamba_num_groups": 8}
MAMBA_EXPAND = 2
HYBRID_LINES = {
    "defaults": {"hidden_size": 256},  # 2 x 256 / 64 = 8 heads, the 8 default groups
    "given": {"hidden_size": 64, "mamba_state_dim": 16, "mamba_head_dim": 16,
              "mamba_num_groups": 2, "mamba_num_heads": 4, "swiglu": True,
              "ffn_hidden_size": 96, "normalization": "RMSNorm",
              "attention_softmax_in_fp32": True},
    # Nemotron-H's flags (Megatron-LM's examples/post_training/.../Nemotron-H-8B-Base-8K.sh)
    "nemotron_h_like": {"hidden_size": 64, "mamba_state_dim": 16, "mamba_head_dim": 16,
                        "mamba_num_groups": 2, "mamba_num_heads": 8, "squared_relu": True,
                        "disable_bias_linear": True, "normalization": "RMSNorm",
                        "group_query_attention": True, "num_query_groups": 2,
                        "untie_embeddings_and_output_weights": True,
                        "position_embedding_type": "rope", "rotary_percent": 0.5,
                        "rotary_base": 500000},
}


@pytest.mark.parametrize("name", sorted(HYBRID_LINES))
def test_hybrid_transformer_config_equals_megatron_lms(name):
    """Megatron-LM's pretrain_mamba.py builds the same config function's output with
    --is-hybrid-model and the Mamba flags copied by name. It leaves --mamba-num-heads None for
    the mixer to derive (2 x hidden / head dim); ours holds the derived count: the same
    mixer."""
    from megatron.varlen_training.config.from_flags import parse_hybrid_run_config
    from megatron.varlen_training.hybrid_model import build_hybrid_config

    flags = {"num_layers": 4, "num_attention_heads": 4, **HYBRID_LINES[name]}
    mamba = {**MAMBA_DEFAULTS, **{key: flags.pop(key) for key in list(flags)
                                  if key in MAMBA_DEFAULTS or key == "mamba_num_heads"}}
    argv = _argv(flags) + _argv(mamba)[len(BASE_ARGV):] + ["--hybrid-override-pattern",
                                                            "M*M-"]
    ours = build_hybrid_config(parse_hybrid_run_config(argv, world_size=1))
    expected = {**megatron_lm_config(flags), **MAMBA_DEFAULTS, **mamba,
                "is_hybrid_model": True}
    expected.pop("mamba_num_heads", None)
    heads = mamba.get("mamba_num_heads") or (
        MAMBA_EXPAND * flags["hidden_size"] // expected["mamba_head_dim"])
    expected["mamba_num_heads"] = heads
    differing = _differing(ours, expected)
    assert not differing, f"{name}: field: (ours, Megatron-LM's) {differing}"


def test_resume_with_other_rope_share_is_refused(tmp_path):
    """--rotary-percent / --rotary-seq-len-interpolation-factor change the model: run_args.json
    records them, so a resume with other values is refused in one line; a checkpoint written
    before they were recorded had full, uninterpolated RoPE."""
    import json

    from megatron.varlen_training.errors import CheckpointError
    from megatron.varlen_training.resume.consistency import check_run_args
    from megatron.varlen_training.resume.run_args_keys import RUN_ARGS_FILENAME
    from megatron.varlen_training.resume.run_args_record import save_run_args

    rope = {**TINY, "position_embedding_type": "rope"}
    saved = parse_run_config(_argv({**rope, "rotary_percent": 0.5}), world_size=1)
    save_run_args(str(tmp_path), saved)
    assert check_run_args(str(tmp_path), saved, check_data=False) is None
    with pytest.raises(CheckpointError, match="--rotary-percent 0.5, this run has 1.0"):
        check_run_args(str(tmp_path), parse_run_config(_argv(rope), world_size=1),
                       check_data=False)
    path = tmp_path / RUN_ARGS_FILENAME
    recorded = json.loads(path.read_text())
    for key in ("rotary_percent", "rotary_seq_len_interpolation_factor"):
        del recorded[key]
    path.write_text(json.dumps(recorded))
    assert check_run_args(str(tmp_path), parse_run_config(_argv(rope), world_size=1),
                          check_data=False) is None


# Megatron-LM core_v0.16.1's argparse dests that are not the flag's name (TransformerConfig
# field names): a namespace or a megatron-wrap view carries them under these keys.
MEGATRON_LM_DESTS = {"--apply-layernorm-1p": "layernorm_zero_centered_gamma",
                     "--fp8-format": "fp8", "--fp4-format": "fp4",
                     # ModelParallelConfig's field (Megatron-LM generates the flag from it)
                     "--microbatch-group-size-per-virtual-pipeline-stage":
                         "microbatch_group_size_per_vp_stage"}


def test_model_flags_keep_megatron_lms_dests():
    dests = {option: action.dest for action in build_hybrid_parser().flag_actions
             for option in action.option_strings}
    assert {flag: dests[flag] for flag in MEGATRON_LM_DESTS} == MEGATRON_LM_DESTS


def test_use_checkpoint_args_takes_the_rope_share(tmp_path):
    """Megatron-LM's load_args_from_checkpoint forces rotary_percent from the checkpoint
    (``_set_arg('rotary_percent', force=True)``): the checkpoint's value replaces the command
    line's."""
    from tests.unit_tests.varlen_training import test_use_checkpoint_args as ckptargs

    root = ckptargs._record(tmp_path / "ckpt", 2, ckptargs.ARCHITECTURE + ckptargs.TRAINING
                            + ["--rotary-percent", "0.5"])
    run = parse_run_config(ckptargs.TRAINING + ckptargs.USE
                           + ["--load", str(root), "--rotary-percent", "1.0"], world_size=1)
    assert run.model.rotary_percent == 0.5
