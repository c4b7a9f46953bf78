"""What a Hugging Face ``config.json`` becomes here, as explicit values: the architectures we
read, the keys every family ignores or pins, and the parsed config. Shared by the Llama/Qwen
parser (hf/config.py) and DeepSeek-V3's (hf/deepseek.py), which config.py dispatches to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class Family(NamedTuple):
    """What an architecture adds to the Llama layer."""

    model_type: str
    qkv_bias: bool
    qk_layernorm: bool


ARCHITECTURES = {
    "LlamaForCausalLM": Family("llama", qkv_bias=False, qk_layernorm=False),
    # Llama's layer with a sliding window on every layer (hf/sliding_window.py).
    "MistralForCausalLM": Family("mistral", qkv_bias=False, qk_layernorm=False),
    "Qwen2ForCausalLM": Family("qwen2", qkv_bias=True, qk_layernorm=False),
    "Qwen3ForCausalLM": Family("qwen3", qkv_bias=False, qk_layernorm=True),
    "Qwen3MoeForCausalLM": Family("qwen3_moe", qkv_bias=False, qk_layernorm=True),
    # MLA: --qk-layernorm builds the latent norms (q_a_layernorm, kv_a_layernorm).
    "DeepseekV3ForCausalLM": Family("deepseek_v3", qkv_bias=False, qk_layernorm=True),
}
DEEPSEEK_ARCHITECTURE = "DeepseekV3ForCausalLM"
MOE_ARCHITECTURE = "Qwen3MoeForCausalLM"
SUPPORTED_ACTIVATION = "silu"

# Keys that do not change the forward pass (metadata, generation and runtime settings).
IGNORED_KEYS = frozenset({
    "architectures", "model_type", "transformers_version", "torch_dtype", "dtype", "use_cache",
    "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range", "_name_or_path",
    "max_window_layers", "output_attentions", "output_hidden_states", "return_dict",
    "tokenizer_class", "sep_token_id", "decoder_start_token_id", "id2label", "label2id",
    "problem_type", "chunk_size_feed_forward", "is_encoder_decoder", "tie_encoder_decoder",
})
# Keys whose only supported value is given (None = the key may be absent or null). The
# Llama/Qwen/Mistral parser reads the window keys itself (hf/sliding_window.py).
PINNED_VALUES = {
    "hidden_act": SUPPORTED_ACTIVATION,
    "pretraining_tp": 1,
    "mlp_bias": False,
    "use_sliding_window": False,
    "attention_dropout": 0.0,
}


@dataclass(frozen=True)
class HFMoEConfig:
    """Qwen3-MoE's sparse MLP: experts, top-k, expert width, which layers are sparse, and
    whether the top-k weights are renormalised (megatron: softmax over the top-k logits) or not
    (megatron: --moe-router-pre-softmax)."""

    num_experts: int
    topk: int
    ffn_hidden_size: int
    layer_freq: tuple[int, ...]
    norm_topk_prob: bool
    # DeepSeek-V3's router and shared experts; the defaults are Qwen3-MoE's (none of them).
    shared_ffn_hidden_size: int | None = None  # all shared experts together (megatron: one)
    score_function: str = "softmax"
    expert_bias: bool = False  # e_score_correction_bias: top-k choice only
    num_groups: int | None = None  # group-limited routing (None: any expert)
    group_topk: int | None = None
    topk_scaling_factor: float | None = None  # routed_scaling_factor


@dataclass(frozen=True)
class HFMLAConfig:
    """DeepSeek-V3's multi-latent attention, in megatron-core's terms (hf/deepseek.py)."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_head_dim: int  # qk_nope_head_dim
    qk_pos_emb_head_dim: int  # qk_rope_head_dim
    v_head_dim: int
    # The checkpoint stores the rotated channels as interleaved pairs (megatron-core's MLA
    # layout, no permutation) or as two halves (permuted on import and export).
    rope_interleave: bool = True
    yarn: "tuple[float, float, float] | None" = None  # (factor, mscale, mscale_all_dim)


class HFConfigError(ValueError):
    """A checkpoint directory or config we cannot use; the message is one line."""


@dataclass(frozen=True)
class HFModelConfig:
    """The architecture of a supported Hugging Face causal LM, as explicit values."""

    architecture: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    kv_channels: int
    vocab_size: int
    max_position_embeddings: int
    norm_epsilon: float
    rotary_base: int
    rope_scaling_factor: float | None  # Llama-3 scaling factor, None without scaling
    tied_embeddings: bool
    bos_token_id: int | None = None
    eos_token_id: int | list | None = None
    pad_token_id: int | None = None
    moe: "HFMoEConfig | None" = None  # Qwen3-MoE's experts, None for dense models
    mla: "HFMLAConfig | None" = None  # DeepSeek-V3's attention, None for standard attention
    # The sliding window in our flags' terms: (LEFT, 0), and a 0/1 per layer where only some
    # layers use it (None: every layer); both None without a window.
    window_size: "tuple[int, int] | None" = None
    window_attn_skip_freq: "tuple[int, ...] | None" = None

    @property
    def qkv_bias(self) -> bool:
        return ARCHITECTURES[self.architecture].qkv_bias

    @property
    def qk_layernorm(self) -> bool:
        return ARCHITECTURES[self.architecture].qk_layernorm
