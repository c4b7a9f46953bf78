"""A Hugging Face ``config.json`` <-> our model flags, in one place.

Supported: ``LlamaForCausalLM`` (RMSNorm, SwiGLU, RoPE with optional Llama-3 scaling, GQA, tied
or untied embeddings), ``MistralForCausalLM`` (Llama's layer with a sliding window on every
layer), ``Qwen2ForCausalLM`` (+ QKV bias), ``Qwen3ForCausalLM`` (+ QK RMSNorm, an explicit
``head_dim``; both with a sliding window on the layers ``layer_types`` names),
``Qwen3MoeForCausalLM`` (Qwen3 with sparse MoE MLPs: experts, top-k, expert width, sparse
layers, top-k renormalisation; a window on every layer) and ``DeepseekV3ForCausalLM`` (multi-latent
attention, MoE with shared experts, sigmoid routing with an expert bias, group-limited routing,
dense layers first; its keys are mapped in :mod:`.deepseek`). Every key of ``config.json`` is
either mapped onto a flag, known to have no effect on the forward pass, or pinned to the one
value we support; anything else is refused with one line naming the key, so a checkpoint is
never silently loaded into the wrong model.

Both the ``transformers`` 4.x keys (``rope_theta``, ``rope_scaling``) and the 5.x key
(``rope_parameters``) are read; the export writes both forms.
"""

from __future__ import annotations

import json
import os

from megatron.varlen_training.config import ModelConfig
from megatron.varlen_training.hf.config_schema import (
    ARCHITECTURES, DEEPSEEK_ARCHITECTURE, IGNORED_KEYS, MOE_ARCHITECTURE, PINNED_VALUES,
    SUPPORTED_ACTIVATION, HFConfigError, HFModelConfig, HFMoEConfig,
)
from megatron.varlen_training.hf.deepseek import (
    deepseek_config_json, deepseek_from_model, mla_flag_values, parse_deepseek,
)
from megatron.varlen_training.hf.sliding_window import (
    model_window, parse_window, window_config_json, windowed_architecture,
)

CONFIG_FILENAME = "config.json"
# Qwen3-MoE's MoE keys (transformers 5.x names the expert count num_local_experts, 4.x
# num_experts); the router's own loss settings only matter to transformers' training.
_MOE_KEYS = frozenset({"num_experts", "num_local_experts", "num_experts_per_tok",
                       "moe_intermediate_size", "decoder_sparse_step", "mlp_only_layers",
                       "norm_topk_prob"})
_MOE_TRAINING_KEYS = frozenset({"router_aux_loss_coef", "output_router_logits"})
# Values transformers assumes when config.json omits the key (LlamaConfig's defaults).
HF_DEFAULT_MAX_POSITIONS = 2048
HF_DEFAULT_RMS_NORM_EPS = 1e-6
HF_DEFAULT_ROPE_THETA = 10000.0
LLAMA3_ROPE_TYPE = "llama3"
DEFAULT_ROPE_TYPE = "default"
# megatron-core 0.16.1's RotaryEmbedding applies Llama-3 scaling with these constants fixed;
# only the factor is a parameter. A checkpoint with other values is refused.
MCORE_LLAMA3_ROPE_CONSTANTS = {"low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192}

_MAPPED_KEYS = frozenset({
    "num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
    "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings", "rms_norm_eps",
    "rope_theta", "rope_scaling", "rope_parameters", "tie_word_embeddings", "attention_bias",
})
# The window's keys: hf/sliding_window.py reads them as each architecture does.
_WINDOW_KEYS = frozenset({"use_sliding_window", "sliding_window", "layer_types",
                          "max_window_layers"})
# Model flags (dests) no architecture read or written here has beyond their plain value: an
# attention sink, gpt-oss's GLU offset and clamp, layers without RoPE. An import fixes them at
# that value; an export of another value is refused rather than written without them.
NOT_EXPORTED = {"softmax_type": "vanilla", "glu_linear_offset": 0.0,
                "activation_func_clamp_value": None, "no_rope_freq": None}
# Our MTP layers are not written (Llama/Qwen have none; DeepSeek-V3's are not mapped, and
# transformers does not load them either): an export leaves them out, knowingly.
MTP_EXPORT_HINT = ("{what} does not support --mtp-num-layers {layers} (MTP layers are not "
                   "exported: Llama/Qwen have none, transformers' DeepSeek-V3 does not load "
                   "them); to export the model without them, --save a checkpoint and run "
                   "tools/export_hf.py on it without --mtp-num-layers")



def read_config_json(hf_dir: str) -> dict:
    """The parsed ``config.json`` of ``hf_dir``; HFConfigError when it is missing or bad."""
    path = os.path.join(hf_dir, CONFIG_FILENAME)
    if not os.path.isdir(hf_dir):
        raise HFConfigError(f"Hugging Face checkpoint {hf_dir!r} is not a directory")
    if not os.path.isfile(path):
        raise HFConfigError(f"Hugging Face checkpoint {hf_dir!r} has no {CONFIG_FILENAME}")
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except json.JSONDecodeError as err:
        raise HFConfigError(f"{path}: invalid JSON ({err.msg}, line {err.lineno})") from err


def _architecture(raw: dict, where: str) -> str:
    names = raw.get("architectures") or []
    if len(names) != 1 or names[0] not in ARCHITECTURES:
        raise HFConfigError(f"{where}: unsupported architecture {names!r}; supported: "
                            f"{', '.join(ARCHITECTURES)}")
    expected_type = ARCHITECTURES[names[0]].model_type
    if raw.get("model_type", expected_type) != expected_type:
        raise HFConfigError(f"{where}: model_type {raw['model_type']!r} does not match "
                            f"architecture {names[0]} (expected {expected_type!r})")
    return names[0]


def _moe_config(raw: dict, where: str) -> HFMoEConfig:
    """Qwen3-MoE's sparse layers: layer l is sparse unless it is in ``mlp_only_layers`` or
    ``(l + 1) % decoder_sparse_step`` is not 0 (transformers' rule)."""
    experts = raw.get("num_local_experts", raw.get("num_experts"))
    for key, value in (("num_experts", experts), ("num_experts_per_tok",
                                                  raw.get("num_experts_per_tok")),
                       ("moe_intermediate_size", raw.get("moe_intermediate_size"))):
        if not isinstance(value, int) or value < 1:
            raise HFConfigError(f"{where}: missing or non-positive {key!r}")
    step = raw.get("decoder_sparse_step", 1)
    dense = set(raw.get("mlp_only_layers") or [])
    layers = range(raw["num_hidden_layers"])
    return HFMoEConfig(
        num_experts=experts, topk=raw["num_experts_per_tok"],
        ffn_hidden_size=raw["moe_intermediate_size"],
        layer_freq=tuple(int(l not in dense and (l + 1) % step == 0) for l in layers),
        norm_topk_prob=bool(raw.get("norm_topk_prob", False)))


def _check_keys(raw: dict, where: str, architecture: str) -> None:
    moe_keys = _MOE_KEYS | _MOE_TRAINING_KEYS if architecture == MOE_ARCHITECTURE else set()
    for key, value in raw.items():
        if key in moe_keys or key in _WINDOW_KEYS:
            continue
        if key in PINNED_VALUES:
            if value is not None and value != PINNED_VALUES[key]:
                raise HFConfigError(f"{where}: unsupported value {key}={value!r} (supported: "
                                    f"{PINNED_VALUES[key]!r})")
        elif key not in IGNORED_KEYS and key not in _MAPPED_KEYS:
            raise HFConfigError(f"{where}: unsupported config field {key!r}={value!r}")
    # QKV bias is implied by the architecture; an explicit attention_bias must agree with it
    # (Llama's attention_bias would also put a bias on o_proj, which megatron cannot hold).
    bias = raw.get("attention_bias")
    if bias is not None and bias != ARCHITECTURES[architecture].qkv_bias:
        raise HFConfigError(f"{where}: unsupported value attention_bias={bias!r} for "
                            f"{architecture}")


def _rope(raw: dict, where: str) -> tuple[int, float | None]:
    """(rotary base, Llama-3 scaling factor or None) from the 4.x or 5.x keys."""
    params = dict(raw.get("rope_parameters") or {})
    scaling = raw.get("rope_scaling") or {}
    if scaling:
        params.update(scaling)
    theta = params.get("rope_theta", raw.get("rope_theta", HF_DEFAULT_ROPE_THETA))
    if float(theta) != int(theta):
        raise HFConfigError(f"{where}: unsupported value rope_theta={theta!r} (must be an "
                            "integer for --rotary-base)")
    rope_type = params.get("rope_type", params.get("type", DEFAULT_ROPE_TYPE))
    if rope_type == DEFAULT_ROPE_TYPE:
        return int(theta), None
    if rope_type != LLAMA3_ROPE_TYPE:
        raise HFConfigError(f"{where}: unsupported rope scaling type {rope_type!r} (supported: "
                            f"{DEFAULT_ROPE_TYPE!r}, {LLAMA3_ROPE_TYPE!r})")
    for key, value in MCORE_LLAMA3_ROPE_CONSTANTS.items():
        if key in params and float(params[key]) != float(value):
            raise HFConfigError(f"{where}: unsupported value rope_scaling {key}={params[key]!r} "
                                f"(megatron-core fixes it at {value})")
    return int(theta), float(params["factor"])


def parse_hf_config(raw: dict, where: str = CONFIG_FILENAME) -> HFModelConfig:
    """Validates a ``config.json`` dict and returns its architecture as explicit values."""
    architecture = _architecture(raw, where)
    if architecture == DEEPSEEK_ARCHITECTURE:
        return parse_deepseek(raw, where)
    _check_keys(raw, where, architecture)
    for key in ("num_hidden_layers", "hidden_size", "intermediate_size",
                "num_attention_heads", "vocab_size"):
        if not isinstance(raw.get(key), int):
            raise HFConfigError(f"{where}: missing or non-integer {key!r}")
    heads = raw["num_attention_heads"]
    rotary_base, factor = _rope(raw, where)
    window_size, skip_freq = parse_window(raw, architecture, where)
    return HFModelConfig(
        architecture=architecture,
        num_layers=raw["num_hidden_layers"],
        hidden_size=raw["hidden_size"],
        ffn_hidden_size=raw["intermediate_size"],
        num_attention_heads=heads,
        num_query_groups=raw.get("num_key_value_heads") or heads,
        kv_channels=raw.get("head_dim") or raw["hidden_size"] // heads,
        vocab_size=raw["vocab_size"],
        max_position_embeddings=raw.get("max_position_embeddings", HF_DEFAULT_MAX_POSITIONS),
        norm_epsilon=float(raw.get("rms_norm_eps", HF_DEFAULT_RMS_NORM_EPS)),
        rotary_base=rotary_base,
        rope_scaling_factor=factor,
        tied_embeddings=bool(raw.get("tie_word_embeddings", False)),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_id=raw.get("eos_token_id"),
        pad_token_id=raw.get("pad_token_id"),
        moe=_moe_config(raw, where) if architecture == MOE_ARCHITECTURE else None,
        window_size=window_size, window_attn_skip_freq=skip_freq,
    )


def load_hf_config(hf_dir: str) -> HFModelConfig:
    """Reads and validates ``hf_dir/config.json``."""
    return parse_hf_config(read_config_json(hf_dir), os.path.join(hf_dir, CONFIG_FILENAME))


def flag_values(config: HFModelConfig) -> dict:
    """Our flags (argparse dests) that this architecture fixes: name -> value."""
    return {
        "num_layers": config.num_layers,
        "hidden_size": config.hidden_size,
        "ffn_hidden_size": config.ffn_hidden_size,
        "num_attention_heads": config.num_attention_heads,
        "group_query_attention": config.num_query_groups != config.num_attention_heads,
        "num_query_groups": config.num_query_groups,
        "kv_channels": config.kv_channels,
        "vocab_size": config.vocab_size,
        "norm_epsilon": config.norm_epsilon,
        "normalization": "RMSNorm",
        "swiglu": True,
        "disable_bias_linear": True,
        "add_qkv_bias": config.qkv_bias,
        "qk_layernorm": config.qk_layernorm,
        "position_embedding_type": "rope",
        "rotary_base": config.rotary_base,
        "use_rope_scaling": config.rope_scaling_factor is not None,
        "rope_scaling_factor": config.rope_scaling_factor,
        # Llama/Qwen rotate every channel of a head at unscaled positions.
        "rotary_percent": 1.0,
        "rotary_seq_len_interpolation_factor": None,
        "untie_embeddings_and_output_weights": not config.tied_embeddings,
        **NOT_EXPORTED,  # an imported model has none of these
        "window_size": config.window_size,
        "window_attn_skip_freq": (list(config.window_attn_skip_freq)  # as the flag parses it
                                  if config.window_attn_skip_freq is not None else None),
        **_moe_flag_values(config.moe),
        **mla_flag_values(config.mla),  # after kv_channels: MLA leaves it unset
    }


def _moe_flag_values(moe: HFMoEConfig | None) -> dict:
    if moe is None:
        return {}
    return {"num_experts": moe.num_experts, "moe_router_topk": moe.topk,
            "moe_ffn_hidden_size": moe.ffn_hidden_size, "moe_layer_freq": list(moe.layer_freq),
            # softmax: renormalised top-k = softmax over the top-k logits (no pre-softmax)
            "moe_router_pre_softmax": moe.score_function == "softmax" and not moe.norm_topk_prob,
            "moe_shared_expert_intermediate_size": moe.shared_ffn_hidden_size,
            "moe_router_score_function": moe.score_function,
            "moe_router_enable_expert_bias": moe.expert_bias,
            "moe_router_num_groups": moe.num_groups, "moe_router_group_topk": moe.group_topk,
            "moe_router_topk_scaling_factor": moe.topk_scaling_factor}


# Defaults that follow the checkpoint but that a fine-tuning run may change freely.
def overridable_defaults(config: HFModelConfig) -> dict:
    return {
        "max_position_embeddings": config.max_position_embeddings,
        "hidden_dropout": 0.0,      # Llama/Qwen have no hidden dropout
        "attention_dropout": 0.0,   # pinned to 0 in the config (see PINNED_VALUES)
        # Megatron pads the vocabulary to a multiple of 128 x TP; padded rows add logits of 0
        # to the softmax. Padding only to TP keeps the loss identical to transformers' whenever
        # TP divides the vocabulary (true for Llama/Qwen vocabularies and usual TP sizes).
        "make_vocab_size_divisible_by": 1,
        # transformers keeps DeepSeek-V3's router in float32 (_keep_in_fp32_modules_strict)
        **({"moe_router_dtype": "fp32"} if config.mla is not None else {}),
    }


def config_from_model(model: ModelConfig) -> HFModelConfig:
    """The Hugging Face architecture a run's model is (for export); HFConfigError if none."""
    needed = {"normalization": "RMSNorm", "swiglu": True, "disable_bias_linear": True,
              "position_embedding_type": "rope", **NOT_EXPORTED}
    for dest, value in needed.items():
        if getattr(model, dest) != value:
            flag = "--" + dest.replace("_", "-")
            raise HFConfigError(f"export to Hugging Face needs {flag} {value} (got "
                                f"{getattr(model, dest)!r}); only Llama/Qwen2/Qwen3/Mistral "
                                f"layers export")
    if model.rotary_percent != 1.0 or model.rotary_seq_len_interpolation_factor is not None:
        raise HFConfigError(f"Llama/Qwen rotate every channel at unscaled positions: export "
                            f"to Hugging Face needs --rotary-percent 1.0 (got "
                            f"{model.rotary_percent}) and no --rotary-seq-len-interpolation-"
                            f"factor (got {model.rotary_seq_len_interpolation_factor})")
    if model.mtp_num_layers:
        raise HFConfigError(MTP_EXPORT_HINT.format(what="export to Hugging Face",
                                                   layers=model.mtp_num_layers))
    if model.add_qkv_bias and model.qk_layernorm:
        raise HFConfigError("no supported Hugging Face architecture has both --add-qkv-bias "
                            "and --qk-layernorm")
    window = model_window(model.window_size, model.window_attn_skip_freq, model.num_layers)
    skip_flag = _shown(model.window_attn_skip_freq)
    if model.mla is not None:
        windowed_architecture(DEEPSEEK_ARCHITECTURE, window, skip_flag)  # refuses a window
        return deepseek_from_model(model, **_common_fields(model))
    moe = _export_moe(model)
    architecture = ("Qwen2ForCausalLM" if model.add_qkv_bias else
                    MOE_ARCHITECTURE if moe is not None else
                    "Qwen3ForCausalLM" if model.qk_layernorm else "LlamaForCausalLM")
    return HFModelConfig(architecture=windowed_architecture(architecture, window, skip_flag),
                         moe=moe, window_size=window[0], window_attn_skip_freq=window[1],
                         **_common_fields(model))


def _shown(skip_freq) -> str:
    """A --window-attn-skip-freq value as the command line gives it."""
    return (str(skip_freq) if not isinstance(skip_freq, tuple) else
            "[" + ",".join(map(str, skip_freq)) + "]")


def _common_fields(model: ModelConfig) -> dict:
    """The HFModelConfig fields every architecture takes from the run's model."""
    return dict(
        num_layers=model.num_layers, hidden_size=model.hidden_size,
        ffn_hidden_size=model.ffn_hidden_size, num_attention_heads=model.num_attention_heads,
        num_query_groups=model.num_query_groups, kv_channels=model.head_dim,
        vocab_size=model.vocab_size, max_position_embeddings=model.max_position_embeddings,
        norm_epsilon=model.norm_epsilon, rotary_base=model.rotary_base,
        rope_scaling_factor=model.rope_scaling_factor if model.use_rope_scaling else None,
        tied_embeddings=model.tied_output)


def _export_moe(model: ModelConfig) -> HFMoEConfig | None:
    """Qwen3-MoE's sparse MLP of an MoE model; HFConfigError for what Qwen3-MoE cannot hold."""
    moe = model.moe
    if moe is None:
        return None
    unsupported = {"--moe-shared-expert-intermediate-size": moe.moe_shared_expert_intermediate_size,
                   "--moe-router-topk-scaling-factor": moe.moe_router_topk_scaling_factor,
                   "--moe-router-num-groups": moe.moe_router_num_groups}
    for flag, value in unsupported.items():
        if value is not None:
            raise HFConfigError(f"export to Hugging Face: Qwen3-MoE has no {flag} (got {value})")
    if moe.moe_router_score_function != "softmax" or not model.qk_layernorm \
            or model.add_qkv_bias:
        raise HFConfigError("export to Hugging Face: an MoE model exports as Qwen3-MoE, which "
                            "needs --qk-layernorm, softmax router scores and no QKV bias")
    flags = moe.is_moe_layer(model.num_layers)
    return HFMoEConfig(num_experts=moe.num_experts, topk=moe.moe_router_topk,
                       ffn_hidden_size=moe.moe_ffn_hidden_size or model.ffn_hidden_size,
                       layer_freq=tuple(int(flag) for flag in flags),
                       norm_topk_prob=not moe.moe_router_pre_softmax)


def _moe_config_json(moe: HFMoEConfig) -> dict:
    dense = [layer for layer, sparse in enumerate(moe.layer_freq) if not sparse]
    return {"num_experts": moe.num_experts, "num_local_experts": moe.num_experts,
            "num_experts_per_tok": moe.topk, "moe_intermediate_size": moe.ffn_hidden_size,
            "decoder_sparse_step": 1, "mlp_only_layers": dense,
            "norm_topk_prob": moe.norm_topk_prob, "output_router_logits": False}


def to_config_json(config: HFModelConfig, torch_dtype: str) -> dict:
    """A ``config.json`` dict that ``transformers`` 4.x and 5.x both read (DeepSeek-V3: 5.x)."""
    if config.mla is not None:
        return {**deepseek_config_json(config, torch_dtype), **token_ids(config)}
    rope = {"rope_type": DEFAULT_ROPE_TYPE, "rope_theta": float(config.rotary_base)}
    if config.rope_scaling_factor is not None:
        rope.update(rope_type=LLAMA3_ROPE_TYPE, factor=config.rope_scaling_factor,
                    **MCORE_LLAMA3_ROPE_CONSTANTS)
    model_type = ARCHITECTURES[config.architecture].model_type
    raw = {
        "architectures": [config.architecture], "model_type": model_type,
        "num_hidden_layers": config.num_layers, "hidden_size": config.hidden_size,
        "intermediate_size": config.ffn_hidden_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_query_groups, "head_dim": config.kv_channels,
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.norm_epsilon, "hidden_act": SUPPORTED_ACTIVATION,
        "rope_theta": float(config.rotary_base), "rope_parameters": rope,
        "rope_scaling": rope if config.rope_scaling_factor is not None else None,
        "tie_word_embeddings": config.tied_embeddings, "torch_dtype": torch_dtype,
        "attention_bias": config.qkv_bias, "attention_dropout": 0.0, "use_cache": True,
    }
    if config.moe is not None:
        raw.update(_moe_config_json(config.moe))
    raw.update(window_config_json(
        config.architecture, (config.window_size, config.window_attn_skip_freq),
        config.num_layers))
    raw.update(token_ids(config))
    return raw


def token_ids(config: HFModelConfig) -> dict:
    """The special token ids the checkpoint names (``bos``/``eos``/``pad_token_id``), if any."""
    ids = {"bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id,
           "pad_token_id": config.pad_token_id}
    return {key: value for key, value in ids.items() if value is not None}
