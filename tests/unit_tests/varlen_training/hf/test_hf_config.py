"""config.json <-> flags: both transformers key styles, and the export's config reads back."""

import dataclasses

from megatron.varlen_training.hf.config import flag_values, parse_hf_config, to_config_json

# A Llama-3-style config.json as transformers 4.x writes it (rope_theta / rope_scaling).
LLAMA3_V4 = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
    "attention_dropout": 0.0, "bos_token_id": 128000, "eos_token_id": 128001,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": False,
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0", "use_cache": True, "vocab_size": 128256,
}
# The same model as transformers 5.x writes it (rope_parameters).
LLAMA3_V5 = {**{k: v for k, v in LLAMA3_V4.items() if k not in ("rope_scaling", "rope_theta")},
             "rope_parameters": {**LLAMA3_V4["rope_scaling"], "rope_theta": 500000.0}}


def test_transformers_4_and_5_keys_give_the_same_flags():
    v4, v5 = parse_hf_config(LLAMA3_V4), parse_hf_config(LLAMA3_V5)
    assert v4 == v5
    flags = flag_values(v4)
    assert (flags["num_query_groups"], flags["kv_channels"]) == (8, 128)
    assert flags["rotary_base"] == 500000
    assert flags["use_rope_scaling"] and flags["rope_scaling_factor"] == 8.0
    assert flags["untie_embeddings_and_output_weights"] and not flags["add_qkv_bias"]


def test_exported_config_reads_back_unchanged():
    for raw in (LLAMA3_V4, {**LLAMA3_V4, "architectures": ["Qwen3ForCausalLM"],
                            "model_type": "qwen3", "rope_scaling": None, "head_dim": 96,
                            "tie_word_embeddings": True}):
        config = parse_hf_config(raw)
        assert parse_hf_config(to_config_json(config, "float32")) == config
        assert dataclasses.asdict(config)["architecture"] == raw["architectures"][0]
