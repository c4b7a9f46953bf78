"""DeepSeek-V3 (``DeepseekV3ForCausalLM``) ``config.json`` <-> our MLA + MoE flags.

Reference: ``transformers`` 5.x ``DeepseekV3Config`` / ``DeepseekV3ForCausalLM``. What maps:

- attention: ``q_lora_rank`` (None: queries straight from the hidden states), ``kv_lora_rank``,
  ``qk_nope_head_dim`` / ``qk_rope_head_dim`` / ``v_head_dim`` -> ``--multi-latent-attention``,
  ``--q-lora-rank``, ``--kv-lora-rank``, ``--qk-head-dim``, ``--qk-pos-emb-head-dim``,
  ``--v-head-dim``; the latent norms -> ``--qk-layernorm``. ``rope_interleave`` is a weight
  layout (megatron-core's MLA reads the rotated channels as interleaved pairs): with False the
  rotated rows are permuted on import and back on export (hf/weights.py).
- RoPE: ``rope_theta`` -> ``--rotary-base`` with ``--rope-type rope``; YaRN -> ``--rope-type
  yarn``, ``--rotary-scaling-factor``, ``--mscale``, ``--mscale-all-dim`` only where
  transformers' numbers are megatron-core's (its ``original_max_position_embeddings``,
  ``beta_fast`` and ``beta_slow`` are MLATransformerConfig's fixed defaults); else one line.
- MoE: ``first_k_dense_replace`` -> a ``--moe-layer-freq`` list (dense layers first),
  ``n_routed_experts``, ``num_experts_per_tok``, ``moe_intermediate_size``, ``n_shared_experts``
  (x ``moe_intermediate_size`` -> ``--moe-shared-expert-intermediate-size``), sigmoid scores
  with ``e_score_correction_bias`` -> ``--moe-router-score-function sigmoid
  --moe-router-enable-expert-bias``, ``n_group`` / ``topk_group`` -> group-limited routing,
  ``routed_scaling_factor`` -> ``--moe-router-topk-scaling-factor``.
- MTP: ``num_nextn_predict_layers`` has no effect here: transformers' DeepseekV3ForCausalLM
  builds no MTP layer and skips its weights; the import skips them too, with a log line
  (hf/importer.py), and an export writes 0.
"""

from __future__ import annotations

from megatron.varlen_training.config import ModelConfig
from megatron.varlen_training.hf.config_schema import (
    DEEPSEEK_ARCHITECTURE, IGNORED_KEYS, PINNED_VALUES, SUPPORTED_ACTIVATION, HFConfigError,
    HFMLAConfig, HFModelConfig, HFMoEConfig,
)

MODEL_TYPE = "deepseek_v3"
ROPE, YARN = "rope", "yarn"
SIGMOID = "sigmoid"
# transformers' DeepseekV3 latent norms (q_a_layernorm, kv_a_layernorm) are built without an
# epsilon argument, so they use this one whatever rms_norm_eps says; megatron-core's MLA uses
# one epsilon for every norm, so only this rms_norm_eps gives the same model.
LATENT_NORM_EPS = 1e-6
# transformers scores a group of experts by the sum of its top 2; megatron-core by the sum of
# its top (topk / group_topk).
HF_GROUP_SCORE_TOP = 2
# MLATransformerConfig's YaRN constants (megatron-core 0.16.1); no flag sets them here.
MCORE_YARN_CONSTANTS = {"original_max_position_embeddings": 4096, "beta_fast": 32.0,
                        "beta_slow": 1.0}
MCORE_MSCALE_DEFAULT, MCORE_MSCALE_ALL_DIM_DEFAULT = 1.0, 0.0

_MAPPED_KEYS = frozenset({
    "num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
    "num_key_value_heads", "vocab_size", "max_position_embeddings", "rms_norm_eps",
    "rope_theta", "rope_scaling", "rope_parameters", "rope_interleave", "tie_word_embeddings",
    "attention_bias", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
    "v_head_dim", "head_dim", "qk_head_dim", "n_routed_experts", "num_local_experts",
    "n_shared_experts", "moe_intermediate_size", "num_experts_per_tok", "first_k_dense_replace",
    "n_group", "topk_group", "routed_scaling_factor", "norm_topk_prob",
})
# No effect on the forward pass: MTP layers (not built by transformers either), the training
# losses of the router, expert parallelism and the remote-code loader of the original release.
_IGNORED_KEYS = IGNORED_KEYS | {"num_nextn_predict_layers", "num_mtp_layers", "ep_size",
                                "aux_loss_alpha", "seq_aux", "output_router_logits",
                                "router_aux_loss_coef", "auto_map"}
# The original release's keys for what transformers hard-codes.
_PINNED_VALUES = {**PINNED_VALUES, "scoring_func": SIGMOID, "topk_method": "noaux_tc",
                  "moe_layer_freq": 1, "attention_bias": False}


def _check_keys(raw: dict, where: str) -> None:
    if raw.get("quantization_config"):
        method = raw["quantization_config"].get("quant_method", "?")
        raise HFConfigError(f"{where}: quantized weights ({method}) are not read; convert the "
                            "checkpoint to bfloat16 or float32 first")
    for key, value in raw.items():
        if key in _PINNED_VALUES:
            if value is not None and value != _PINNED_VALUES[key]:
                raise HFConfigError(f"{where}: unsupported value {key}={value!r} (supported: "
                                    f"{_PINNED_VALUES[key]!r})")
        elif key not in _IGNORED_KEYS and key not in _MAPPED_KEYS and key != "quantization_config":
            raise HFConfigError(f"{where}: unsupported config field {key!r}={value!r}")


def _positive(raw: dict, key: str, where: str, default=None) -> int:
    value = raw.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise HFConfigError(f"{where}: missing or non-positive {key!r} (got {value!r})")
    return value


def _check_derived(raw: dict, where: str, heads: int, nope: int, rope: int) -> None:
    """Keys transformers derives (head_dim, qk_head_dim) or that MLA fixes (one key/value head
    per query head) must agree with the shape."""
    for key, value in (("num_key_value_heads", heads), ("head_dim", rope),
                       ("qk_head_dim", nope + rope)):
        if raw.get(key) is not None and raw[key] != value:
            raise HFConfigError(f"{where}: unsupported value {key}={raw[key]!r} (DeepSeek-V3's "
                                f"multi-latent attention needs {value})")
    eps = float(raw.get("rms_norm_eps", LATENT_NORM_EPS))
    if eps != LATENT_NORM_EPS:
        raise HFConfigError(
            f"{where}: unsupported value rms_norm_eps={eps!r}: transformers' DeepseekV3 latent "
            f"norms always use {LATENT_NORM_EPS}, megatron-core's MLA one epsilon for all norms "
            f"(only rms_norm_eps={LATENT_NORM_EPS} gives the same model)")


def _rope_params(raw: dict) -> dict:
    params = dict(raw.get("rope_parameters") or {})
    params.update(raw.get("rope_scaling") or {})
    return params


def _yarn(params: dict, where: str) -> tuple[float, float, float]:
    """(factor, mscale, mscale_all_dim) of megatron-core's YaRN that computes what
    transformers' does; HFConfigError where no setting does."""
    for key, value in MCORE_YARN_CONSTANTS.items():
        if key in params and params[key] is not None and float(params[key]) != float(value):
            raise HFConfigError(f"{where}: unsupported YaRN {key}={params[key]!r} (megatron-core's "
                                f"MLA fixes it at {value}); YaRN must match transformers")
    if params.get("attention_factor") is not None or params.get("truncate", True) is not True:
        raise HFConfigError(f"{where}: unsupported YaRN attention_factor/truncate (megatron-core "
                            "derives the attention factor from mscale and truncates the range)")
    factor = params.get("factor")
    if not isinstance(factor, (int, float)) or factor <= 0:
        raise HFConfigError(f"{where}: YaRN needs a positive factor (got {factor!r})")
    mscale, all_dim = params.get("mscale"), params.get("mscale_all_dim")
    if mscale and all_dim:  # transformers: cos/sin x m(f, mscale) / m(f, all_dim), as megatron
        return float(factor), float(mscale), float(all_dim)
    if all_dim:  # transformers' cos/sin then ignore mscale_all_dim, its softmax scale does not
        raise HFConfigError(f"{where}: unsupported YaRN mscale={mscale!r} with mscale_all_dim="
                            f"{all_dim!r} (megatron-core cannot compute transformers' scales)")
    # transformers: cos/sin x m(f, 1), softmax scale unchanged (megatron: mscale 1, all_dim 0).
    return float(factor), MCORE_MSCALE_DEFAULT, MCORE_MSCALE_ALL_DIM_DEFAULT


def _rope(raw: dict, where: str) -> tuple[int, tuple[float, float, float] | None]:
    params = _rope_params(raw)
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    if float(theta) != int(theta):
        raise HFConfigError(f"{where}: unsupported value rope_theta={theta!r} (must be an "
                            "integer for --rotary-base)")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return int(theta), None
    if rope_type != YARN:
        raise HFConfigError(f"{where}: unsupported rope scaling type {rope_type!r} for "
                            f"DeepSeek-V3 (supported: 'default', {YARN!r})")
    return int(theta), _yarn(params, where)


def _mla(raw: dict, where: str) -> HFMLAConfig:
    q_lora = raw.get("q_lora_rank")
    if q_lora is not None:
        q_lora = _positive(raw, "q_lora_rank", where)
    rope = _positive(raw, "qk_rope_head_dim", where)
    if rope % 2:
        raise HFConfigError(f"{where}: qk_rope_head_dim {rope} must be even (RoPE rotates pairs)")
    interleave = raw.get("rope_interleave", True)
    return HFMLAConfig(
        q_lora_rank=q_lora, kv_lora_rank=_positive(raw, "kv_lora_rank", where),
        qk_head_dim=_positive(raw, "qk_nope_head_dim", where), qk_pos_emb_head_dim=rope,
        v_head_dim=_positive(raw, "v_head_dim", where),
        rope_interleave=bool(True if interleave is None else interleave),
        yarn=_rope(raw, where)[1])


def _groups(raw: dict, where: str, experts: int, topk: int) -> tuple[int | None, int | None]:
    """megatron-core's (num_groups, group_topk); (None, None) where the groups limit nothing."""
    groups, group_topk = raw.get("n_group") or 1, raw.get("topk_group") or 1
    if groups <= 1 or group_topk >= groups:
        return None, None
    if experts % groups or topk != HF_GROUP_SCORE_TOP * group_topk:
        raise HFConfigError(
            f"{where}: unsupported group-limited routing n_group={groups}, topk_group="
            f"{group_topk}, num_experts_per_tok={topk}: transformers scores a group by its top "
            f"{HF_GROUP_SCORE_TOP} experts, megatron-core by its top num_experts_per_tok / "
            f"topk_group, so num_experts_per_tok must be {HF_GROUP_SCORE_TOP * group_topk}")
    return groups, group_topk


def _moe(raw: dict, where: str) -> HFMoEConfig:
    experts = _positive(raw, "n_routed_experts", where, raw.get("num_local_experts"))
    topk = _positive(raw, "num_experts_per_tok", where)
    width = _positive(raw, "moe_intermediate_size", where)
    norm = raw.get("norm_topk_prob", True)
    if bool(norm) != (topk > 1):  # megatron-core's sigmoid router renormalises iff top-k > 1
        raise HFConfigError(f"{where}: unsupported norm_topk_prob={norm!r} with "
                            f"num_experts_per_tok={topk} (megatron-core's sigmoid router "
                            f"renormalises the top-k weights exactly when k > 1)")
    dense = raw.get("first_k_dense_replace") or 0
    shared = raw.get("n_shared_experts") or 0
    groups, group_topk = _groups(raw, where, experts, topk)
    return HFMoEConfig(
        num_experts=experts, topk=topk, ffn_hidden_size=width,
        layer_freq=tuple(int(layer >= dense) for layer in range(raw["num_hidden_layers"])),
        norm_topk_prob=bool(norm), shared_ffn_hidden_size=shared * width or None,
        score_function=SIGMOID, expert_bias=True, num_groups=groups, group_topk=group_topk,
        topk_scaling_factor=float(raw.get("routed_scaling_factor", 1.0)))


def parse_deepseek(raw: dict, where: str) -> HFModelConfig:
    """A DeepSeek-V3 ``config.json`` dict as explicit values; HFConfigError (one line) for what
    our model cannot compute as transformers does."""
    _check_keys(raw, where)
    for key in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                "vocab_size"):
        _positive(raw, key, where)
    heads = raw["num_attention_heads"]
    mla = _mla(raw, where)
    _check_derived(raw, where, heads, mla.qk_head_dim, mla.qk_pos_emb_head_dim)
    return HFModelConfig(
        architecture=DEEPSEEK_ARCHITECTURE, num_layers=raw["num_hidden_layers"],
        hidden_size=raw["hidden_size"], ffn_hidden_size=raw["intermediate_size"],
        num_attention_heads=heads, num_query_groups=heads,
        kv_channels=raw["hidden_size"] // heads, vocab_size=raw["vocab_size"],
        max_position_embeddings=raw.get("max_position_embeddings", 4096),
        norm_epsilon=LATENT_NORM_EPS, rotary_base=_rope(raw, where)[0],
        rope_scaling_factor=None, tied_embeddings=bool(raw.get("tie_word_embeddings", False)),
        bos_token_id=raw.get("bos_token_id"), eos_token_id=raw.get("eos_token_id"),
        pad_token_id=raw.get("pad_token_id"), moe=_moe(raw, where), mla=mla)


def mla_flag_values(mla: HFMLAConfig | None) -> dict:
    """The MLA flags (argparse dests) a checkpoint fixes; standard attention: MLA off."""
    if mla is None:
        return {"multi_latent_attention": False}
    factor, mscale, all_dim = mla.yarn or (1.0, MCORE_MSCALE_DEFAULT, MCORE_MSCALE_ALL_DIM_DEFAULT)
    return {"multi_latent_attention": True, "q_lora_rank": mla.q_lora_rank,
            "kv_lora_rank": mla.kv_lora_rank, "qk_head_dim": mla.qk_head_dim,
            "qk_pos_emb_head_dim": mla.qk_pos_emb_head_dim, "v_head_dim": mla.v_head_dim,
            "kv_channels": None, "rope_type": YARN if mla.yarn else ROPE,
            "rotary_scaling_factor": factor, "mscale": mscale, "mscale_all_dim": all_dim}


def _rope_json(config: HFModelConfig) -> dict:
    rope = {"rope_type": "default", "rope_theta": float(config.rotary_base)}
    if config.mla.yarn is not None:
        factor, mscale, all_dim = config.mla.yarn
        rope.update(rope_type=YARN, factor=factor, mscale=mscale, mscale_all_dim=all_dim,
                    **MCORE_YARN_CONSTANTS)
    return rope


def deepseek_config_json(config: HFModelConfig, torch_dtype: str) -> dict:
    """A DeepSeek-V3 ``config.json`` dict that ``transformers`` reads (no MTP layers)."""
    mla, moe = config.mla, config.moe
    rope = _rope_json(config)
    return {
        "architectures": [DEEPSEEK_ARCHITECTURE], "model_type": MODEL_TYPE,
        "num_hidden_layers": config.num_layers, "hidden_size": config.hidden_size,
        "intermediate_size": config.ffn_hidden_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_attention_heads, "vocab_size": config.vocab_size,
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.norm_epsilon, "hidden_act": SUPPORTED_ACTIVATION,
        "q_lora_rank": mla.q_lora_rank, "kv_lora_rank": mla.kv_lora_rank,
        "qk_nope_head_dim": mla.qk_head_dim, "qk_rope_head_dim": mla.qk_pos_emb_head_dim,
        "v_head_dim": mla.v_head_dim, "rope_interleave": mla.rope_interleave,
        "rope_theta": float(config.rotary_base), "rope_parameters": rope,
        "rope_scaling": rope if mla.yarn is not None else None,
        "n_routed_experts": moe.num_experts, "num_experts_per_tok": moe.topk,
        "moe_intermediate_size": moe.ffn_hidden_size,
        "n_shared_experts": (moe.shared_ffn_hidden_size or 0) // moe.ffn_hidden_size,
        "first_k_dense_replace": moe.layer_freq.index(1),
        "n_group": moe.num_groups or 1, "topk_group": moe.group_topk or 1,
        "routed_scaling_factor": moe.topk_scaling_factor or 1.0,
        "norm_topk_prob": moe.norm_topk_prob, "num_nextn_predict_layers": 0,
        "tie_word_embeddings": config.tied_embeddings, "torch_dtype": torch_dtype,
        "attention_bias": False, "attention_dropout": 0.0, "use_cache": True,
    }


def _export_problem(model: ModelConfig) -> str | None:
    """Why a run's MLA model is no DeepSeek-V3 that transformers computes alike (None: it is)."""
    moe, mla = model.moe, model.mla
    if moe is None:
        return "needs MoE layers (--num-experts)"
    pattern = [int(flag) for flag in moe.is_moe_layer(model.num_layers)]
    first = pattern.index(1) if 1 in pattern else len(pattern)
    problems = {
        "needs --qk-layernorm (the latent norms)": not model.qk_layernorm,
        f"needs --norm-epsilon {LATENT_NORM_EPS} (transformers' latent norms use it)":
            model.norm_epsilon != LATENT_NORM_EPS,
        "needs --moe-router-score-function sigmoid and --moe-router-enable-expert-bias":
            moe.moe_router_score_function != SIGMOID or not moe.moe_router_enable_expert_bias,
        "needs --moe-layer-freq with dense layers first, then MoE layers only (first_k_dense_"
        "replace)": first == len(pattern) or any(flag == 0 for flag in pattern[first:]),
        "needs --moe-shared-expert-intermediate-size a multiple of --moe-ffn-hidden-size":
            (moe.moe_shared_expert_intermediate_size or 0)
            % (moe.moe_ffn_hidden_size or model.ffn_hidden_size) != 0,
        f"needs --moe-router-topk = {HF_GROUP_SCORE_TOP} x --moe-router-group-topk "
        "(transformers scores a group by its top 2 experts)":
            moe.moe_router_group_topk is not None
            and moe.moe_router_topk != HF_GROUP_SCORE_TOP * moe.moe_router_group_topk,
        "needs --rope-type yarn with --mscale and --mscale-all-dim both non-zero, or --mscale 1 "
        "and --mscale-all-dim 0 (transformers' YaRN scales)":
            mla.rope_type == YARN and not (mla.mscale and mla.mscale_all_dim) and not (
                mla.mscale == MCORE_MSCALE_DEFAULT
                and mla.mscale_all_dim == MCORE_MSCALE_ALL_DIM_DEFAULT),
    }
    return next((why for why, bad in problems.items() if bad), None)


def deepseek_from_model(model: ModelConfig, **common) -> HFModelConfig:
    """The DeepSeek-V3 architecture of an MLA run (for export); ``common``: the
    HFModelConfig fields every architecture shares. HFConfigError if it is none."""
    problem = _export_problem(model)
    if problem is not None:
        raise HFConfigError(f"export of --multi-latent-attention to Hugging Face (DeepSeek-V3) "
                            f"{problem}")
    moe, mla = model.moe, model.mla
    yarn = None
    if mla.rope_type == YARN:
        yarn = (mla.rotary_scaling_factor, mla.mscale, mla.mscale_all_dim)
    width = moe.moe_ffn_hidden_size or model.ffn_hidden_size
    return HFModelConfig(
        architecture=DEEPSEEK_ARCHITECTURE, **common,
        moe=HFMoEConfig(
            num_experts=moe.num_experts, topk=moe.moe_router_topk, ffn_hidden_size=width,
            layer_freq=tuple(int(flag) for flag in moe.is_moe_layer(model.num_layers)),
            norm_topk_prob=moe.moe_router_topk > 1,
            shared_ffn_hidden_size=moe.moe_shared_expert_intermediate_size,
            score_function=SIGMOID, expert_bias=True, num_groups=moe.moe_router_num_groups,
            group_topk=moe.moe_router_group_topk,
            topk_scaling_factor=moe.moe_router_topk_scaling_factor),
        mla=HFMLAConfig(q_lora_rank=mla.q_lora_rank, kv_lora_rank=mla.kv_lora_rank,
                        qk_head_dim=mla.qk_head_dim, qk_pos_emb_head_dim=mla.qk_pos_emb_head_dim,
                        v_head_dim=mla.v_head_dim, yarn=yarn))
