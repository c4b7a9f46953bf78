"""DeepSeek-V3's config.json -> our flags, by hand from DeepSeek-V3's own release config, and
each config our model cannot compute as transformers does refused in one line (no launch).

The key proof that the mapped flags build transformers' model is test_hf_deepseek.py (logits).
"""

import pytest

from megatron.varlen_training.arguments import ArgumentValidationError
from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.hf.config import (
    HFConfigError, flag_values, parse_hf_config, to_config_json,
)
from tests.harness.training_runs import TINY_GPT_ARGS

# deepseek-ai/DeepSeek-V3's config.json (the remote-code release), without its fp8
# quantization_config (refused below) and auto_map (ignored).
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "attention_bias": False, "attention_dropout": 0.0, "aux_loss_alpha": 0.001,
    "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3,
    "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02,
    "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840,
    "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256,
    "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
    "seq_aux": True, "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16", "transformers_version": "4.33.1", "use_cache": True,
    "v_head_dim": 128, "vocab_size": 129280,
}
# What Megatron-LM's DeepSeek-V3 recipe passes for the same model (its flag names).
EXPECTED_FLAGS = {
    "num_layers": 61, "hidden_size": 7168, "ffn_hidden_size": 18432,
    "num_attention_heads": 128, "multi_latent_attention": True, "q_lora_rank": 1536,
    "kv_lora_rank": 512, "qk_head_dim": 128, "qk_pos_emb_head_dim": 64, "v_head_dim": 128,
    "qk_layernorm": True, "rope_type": "yarn", "rotary_base": 10000,
    "rotary_scaling_factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0,
    "norm_epsilon": 1e-6, "num_experts": 256, "moe_router_topk": 8,
    "moe_ffn_hidden_size": 2048, "moe_shared_expert_intermediate_size": 2048,
    "moe_layer_freq": [0] * 3 + [1] * 58, "moe_router_score_function": "sigmoid",
    "moe_router_enable_expert_bias": True, "moe_router_pre_softmax": False,
    "moe_router_num_groups": 8, "moe_router_group_topk": 4,
    "moe_router_topk_scaling_factor": 2.5, "untie_embeddings_and_output_weights": True,
    "group_query_attention": False, "vocab_size": 129280,
}


def test_deepseek_v3_release_config_gives_megatron_lm_flags():
    flags = flag_values(parse_hf_config(DEEPSEEK_V3))
    assert {key: flags[key] for key in EXPECTED_FLAGS} == EXPECTED_FLAGS


def test_exported_config_reads_back_unchanged():
    config = parse_hf_config(DEEPSEEK_V3)
    assert parse_hf_config(to_config_json(config, "bfloat16")) == config


@pytest.mark.parametrize("change, needle", [
    ({"quantization_config": {"quant_method": "fp8"}}, "quantized weights (fp8) are not read"),
    ({"rms_norm_eps": 1e-5}, "rms_norm_eps=1e-05: transformers' DeepseekV3 latent norms"),
    ({"norm_topk_prob": False}, "norm_topk_prob=False with num_experts_per_tok=8"),
    ({"topk_group": 2}, "so num_experts_per_tok must be 4"),
    ({"num_key_value_heads": 16}, "num_key_value_heads=16 (DeepSeek-V3's multi-latent"),
    ({"scoring_func": "softmax"}, "unsupported value scoring_func='softmax'"),
    ({"rope_scaling": {**DEEPSEEK_V3["rope_scaling"], "original_max_position_embeddings": 8192}},
     "unsupported YaRN original_max_position_embeddings=8192"),
    ({"rope_scaling": {**DEEPSEEK_V3["rope_scaling"], "mscale": 0.0}},
     "unsupported YaRN mscale=0.0 with mscale_all_dim=1.0"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "unsupported rope scaling type"),
    ({"qk_rope_head_dim": 63}, "qk_rope_head_dim 63 must be even"),
    ({"some_new_key": 1}, "unsupported config field 'some_new_key'=1"),
])
def test_unsupported_configs_are_one_line(change, needle):
    with pytest.raises(HFConfigError) as err:
        parse_hf_config({**DEEPSEEK_V3, **change})
    assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_mtp_layers_are_skipped_with_a_log_line(monkeypatch):
    """The release's MTP layer is layer 61 of 61 decoder layers: skipped, and said so."""
    from megatron.varlen_training.hf import importer

    logged = []
    monkeypatch.setattr(importer, "print_rank_0", logged.append)
    names = ["model.layers.60.mlp.gate.weight", "model.layers.61.eh_proj.weight",
             "model.layers.61.mlp.gate.weight", "model.norm.weight"]
    assert importer.log_skipped_layers(names, 61, "DIR") == [61]
    assert logged == ["> skipped 2 tensors of layers [61] of DIR (MTP layers: transformers does "
                      "not load them either; --mtp-num-layers is not initialised from them)"]
    assert importer.log_skipped_layers(names[:1], 61, "DIR") == [] and len(logged) == 1


MLA_MOE = ["--multi-latent-attention", "--q-lora-rank", "12", "--kv-lora-rank", "16",
           "--qk-head-dim", "8", "--qk-pos-emb-head-dim", "4", "--v-head-dim", "6",
           "--qk-layernorm", "--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear",
           "--position-embedding-type", "rope", "--norm-epsilon", "1e-6", "--num-experts", "4",
           "--moe-layer-freq", "([0]*1+[1]*1)", "--moe-router-score-function", "sigmoid",
           "--moe-router-enable-expert-bias", "--save-hf", "/nonexistent/out"]


@pytest.mark.parametrize("change, needle", [
    ([], None),
    (["--moe-router-topk", "2", "--moe-router-num-groups", "2", "--moe-router-group-topk", "2"],
     "needs --moe-router-topk = 2 x --moe-router-group-topk"),
    (["--moe-layer-freq", "([1]*1+[0]*1)"], "needs --moe-layer-freq with dense layers first"),
    (["--norm-epsilon", "1e-5"], "needs --norm-epsilon 1e-06"),
])
def test_mla_export_needs_a_deepseek_v3_model(change, needle):
    """--save-hf of an MLA model is checked at start-up: DeepSeek-V3 or one line."""
    argv = TINY_GPT_ARGS + ["--train-iters", "1"] + MLA_MOE + change
    if needle is None:
        parse_run_config(argv, world_size=1)
        return
    with pytest.raises(ArgumentValidationError) as err:
        parse_run_config(argv, world_size=1)
    assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_an_imported_expert_bias_keeps_float32_digits_under_bf16():
    """Float16Module casts the router's expert_bias buffer to bf16; megatron-core switches it back
    to float32 itself, and so must the import, or the checkpoint's bias is rounded (1 + 2^-12 has
    no bf16 value). Other tensors keep the model's dtype."""
    import torch

    from megatron.varlen_training.hf.importer import float32_expert_bias

    value = torch.tensor([1 + 2 ** -12, -3e-4])
    bias = torch.zeros(2, dtype=torch.bfloat16)
    target = float32_expert_bias("decoder.layers.1.mlp.router.expert_bias", bias)
    target.copy_(value)
    assert bias.dtype == torch.float32 and torch.equal(bias, value)
    weight = torch.zeros(2, dtype=torch.bfloat16)
    assert float32_expert_bias("decoder.layers.1.mlp.router.weight", weight).dtype == torch.bfloat16
