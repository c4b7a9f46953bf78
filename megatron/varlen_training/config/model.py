"""``ModelConfig``: the architecture, precision and vocabulary of the model; ``HybridConfig``: the
hybrid Mamba-Transformer's layer pattern and Mamba sizes (pretrain_mamba.py only)."""

from __future__ import annotations

from dataclasses import dataclass

from megatron.varlen_training import flag_ranges
from megatron.varlen_training.config.kernels import KernelConfig
from megatron.varlen_training.config.mla import MLAConfig
from megatron.varlen_training.config.moe import MoEConfig
from megatron.varlen_training.config.validation import check_problems, check_ranges

MAMBA, ATTENTION, MLP, MOE = "M", "*", "-", "E"  # the layer symbols of a hybrid pattern


@dataclass(frozen=True)
class HybridConfig:
    """The hybrid stack: flags as given (recorded with checkpoints) and what validation
    resolved (``hybrid_layer_pattern``, ``mamba_num_heads_resolved``)."""

    hybrid_override_pattern: str | None
    hybrid_attention_ratio: float
    hybrid_mlp_ratio: float
    hybrid_layer_pattern: str
    mamba_state_dim: int
    mamba_head_dim: int
    mamba_num_groups: int
    mamba_num_heads: int | None
    mamba_num_heads_resolved: int

    def __post_init__(self):
        check_ranges(self)


@dataclass(frozen=True)
class ModelConfig:
    """The model's shape, precision and vocabulary; fields are named as their flags' dests.

    ``ffn_hidden_size``, ``num_query_groups`` and ``max_position_embeddings`` hold the values
    validation resolved from their defaults. ``vocab_size`` is ``--vocab-size`` until the
    tokenizer is known, then the run's (:meth:`RunConfig.with_vocabulary`), and
    ``padded_vocab_size`` follows it.
    """

    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    group_query_attention: bool
    num_query_groups: int
    kv_channels: int | None
    seq_length: int
    max_position_embeddings: int
    position_embedding_type: str
    rotary_base: int
    normalization: str
    swiglu: bool
    disable_bias_linear: bool
    untie_embeddings_and_output_weights: bool
    mtp_num_layers: int | None
    make_vocab_size_divisible_by: int
    init_method_std: float
    hidden_dropout: float
    attention_dropout: float
    norm_epsilon: float
    add_qkv_bias: bool
    qk_layernorm: bool
    use_rope_scaling: bool
    rope_scaling_factor: float
    bf16: bool
    fp16: bool
    spec: tuple[str, str] | None
    attention_backend: str
    vocab_size: int | None
    padded_vocab_size: int | None
    hybrid: HybridConfig | None = None
    # Activation recomputation (recompute_arguments.py: resolved and checked there).
    recompute_granularity: str | None = None
    recompute_method: str | None = None
    recompute_num_layers: int | None = None
    recompute_modules: tuple[str, ...] = ("core_attn",)
    moe: MoEConfig | None = None  # None: dense MLPs (no --num-experts)
    # Megatron-LM's model and precision flags (model_arguments.py resolved them).
    rotary_percent: float = 1.0
    mtp_loss_scaling_factor: float = 0.1
    rotary_seq_len_interpolation_factor: int | None = None
    attention_softmax_in_fp32: bool = False
    apply_query_key_layer_scaling: bool = False
    accumulate_allreduce_grads_in_fp32: bool = False
    kernels: KernelConfig = KernelConfig()  # Megatron-LM's kernel flags (kernel_arguments.py)
    # --apply-layernorm-1p: every norm stores gamma - 1 (megatron-core's field name).
    layernorm_zero_centered_gamma: bool = False
    # --squared-relu: the MLP activation is relu(x)^2 (megatron-core's squared_relu), not GELU.
    squared_relu: bool = False
    # --quick-geglu: a gated MLP with megatron-core's quick_gelu on the gate half (gpt-oss);
    # --glu-linear-offset / --activation-func-clamp-value: act(min(g, c)) * (clamp(l, -c, c) +
    # offset) in a gated MLP (megatron-core's unfused GLU).
    quick_geglu: bool = False
    glu_linear_offset: float = 0.0
    activation_func_clamp_value: float | None = None
    # --window-size / --window-attn-skip-freq: a causal sliding window (LEFT, 0) and the layers
    # it applies to (an int N: all but every N-th; a 0/1 tuple per layer); None: no window.
    # --no-rope-freq: layers that skip RoPE (an int N: every N-th; a 0/1 tuple); None: none.
    no_rope_freq: int | tuple[int, ...] | None = None
    # --softmax-type: vanilla, off-by-one (a zero sink logit) or learnable (a sink per head)
    softmax_type: str = "vanilla"
    window_size: tuple[int, int] | None = None
    window_attn_skip_freq: int | tuple[int, ...] | None = None
    mla: MLAConfig | None = None  # None: standard attention (no --multi-latent-attention)

    def __post_init__(self):
        check_ranges(self)
        check_problems(
            flag_ranges.head_split_problem(self.hidden_size, self.num_attention_heads,
                                           self.kv_channels),
            flag_ranges.query_group_problem(self.num_attention_heads, self.num_query_groups,
                                            self.group_query_attention),
            flag_ranges.layer_pattern_problem("--window-attn-skip-freq",
                                              self.window_attn_skip_freq, self.num_layers),
            flag_ranges.layer_pattern_problem("--no-rope-freq", self.no_rope_freq,
                                              self.num_layers))

    @property
    def head_dim(self) -> int:
        """Channels per attention head (``--kv-channels``, else hidden size / heads)."""
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def gated_mlp(self) -> bool:
        """Whether each MLP is gated (fc1 twice as wide): SwiGLU or quick-GEGLU."""
        return self.swiglu or self.quick_geglu

    @property
    def tied_output(self) -> bool:
        """Whether the output layer shares the word embedding's weight."""
        return not self.untie_embeddings_and_output_weights
