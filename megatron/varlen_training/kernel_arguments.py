"""Megatron-LM's kernel, fusion and implementation flags, its deprecated aliases and the flags it
removed: honoured with Megatron-LM's meaning, accepted where they change nothing here, or
refused in one line.

A Megatron-LM recipe carries these on every command line (examples/gpt3, examples/llama,
examples/mixtral); unknown here, they stopped it with argparse's "unrecognized arguments".
Facts from Megatron-LM core_v0.16.1 (our megatron-core's release) unless a flag says "main":

- Honoured, passed to megatron-core's TransformerConfig exactly as Megatron-LM's
  ``core_transformer_config_from_args`` does: ``--no-bias-dropout-fusion``,
  ``--cross-entropy-loss-fusion`` / ``--cross-entropy-fusion-impl``,
  ``--disable-bf16-reduced-precision-matmul``, ``--transformer-impl``, ``--moe-permute-fusion``
  and ``--moe-router-fusion`` (the last two are Transformer Engine kernels: refused without it).
- Switches that turn a fused kernel off which this fork never runs (``--no-masked-softmax-fusion``,
  ``--no-bias-gelu-fusion``, ``--no-bias-swiglu-fusion``, ``--no-rope-fusion``,
  ``--no-gradient-accumulation-fusion``, ``--no-persist-layer-norm``): they ask for the unfused
  code, which is what runs; the config fields are False either way.
- No-ops in Megatron-LM's own megatron-core models too (``--use-flash-attn``,
  ``--use-mcore-models``, ``--openai-gelu``, ``--onnx-safe``: nothing there reads them), and
  ``--moe-grouped-gemm`` (one GEMM per expert here, megatron-core's SequentialMLP: the same math).
- Deprecated aliases: ``--use-rotary-position-embeddings`` (= ``--position-embedding-type
  rope``), ``--no-position-embedding`` (Megatron-LM: only beside rope, where it changes nothing),
  ``--enable-cuda-graph`` / ``--external-cuda-graph`` (= ``--cuda-graph-impl local`` /
  ``transformer_engine``, refused like it).
- Refused in one line (Megatron-LM's default, given, accepted): the FP8 settings (FP8 itself,
  ``--fp8-format``, is refused in model_arguments.py; ``--fp8`` alone is no Megatron-LM flag),
  TP communication overlap, CUDA graphs, Transformer Engine's RNG tracker, legacy models,
  ``--transformer-impl inference_optimized``, ``--rope-type yarn``, and the flags Megatron-LM
  removed and refuses itself (``--batch-size``, ``--warmup``, ``--model-parallel-size``,
  ``--checkpoint-activations``), each naming its replacement.

tests/unit_tests/varlen_training/test_kernel_arguments.py proves each claim (the config against
a reference written from Megatron-LM's facts, equal losses with and without each no-op).
"""

from __future__ import annotations

import argparse

from megatron.varlen_training.flag_ranges import is_importable
from megatron.varlen_training.refused_choices import megatron_lm_choices
from megatron.varlen_training.refused_flags import (
    SWITCH, FlagRow, add_flag_rows, dest_of, refuse_given,
)

ROPE = "rope"
NATIVE, TE_IMPL = "native", "te"  # --cross-entropy-fusion-impl
TRANSFORMER_ENGINE, LOCAL_IMPL = "transformer_engine", "local"  # --transformer-impl
INFERENCE_OPTIMIZED = "inference_optimized"
_TE_PACKAGE = "transformer_engine"

_UNFUSED = ("this fork never runs that fused kernel (the config field is False either way), so "
            "the flag asks for what runs: accepted")
_NO_OP_IN_MEGATRON_LM = ("Accepted and ignored, as in Megatron-LM, whose megatron-core models "
                         "never read it")
_FP8_WHY = ("an FP8 setting, which only --fp8-format uses: FP8 needs Transformer Engine's FP8 "
            "layers, which this fork does not build")
_CUDA_GRAPH_WHY = ("CUDA graphs replay fixed shapes, and packed THD micro-batches change length "
                   "every step: not built here")
_REMOVED_WHY = "Megatron-LM removed it and refuses it too: {instead}"
REFUSED_FLAGS = (
    FlagRow(("--use-legacy-models",), SWITCH, False,
            "Megatron-LM's legacy (non-megatron-core) models are not built here (Megatron-LM main "
            "removed them too)"),
    FlagRow(("--fp8-recipe",),
            {"choices": ("tensorwise", "delayed", "mxfp8", "blockwise", "custom")}, "delayed",
            _FP8_WHY),
    FlagRow(("--fp8-margin",), {"type": int}, 0, _FP8_WHY),
    FlagRow(("--fp8-interval",), {"type": int}, 1, _FP8_WHY),
    FlagRow(("--fp8-amax-history-len",), {"type": int}, 1, _FP8_WHY),
    FlagRow(("--fp8-amax-compute-algo",), {"choices": ("most_recent", "max")}, "most_recent",
            _FP8_WHY),
    FlagRow(("--fp8-param-gather",), SWITCH, False, _FP8_WHY),
    FlagRow(("--tp-comm-overlap",), SWITCH, False,
            "overlapping tensor-parallel communication with GEMMs needs Transformer Engine's "
            "userbuffers, which this fork does not build"),
    FlagRow(("--tp-comm-overlap-cfg",), {}, None, "it configures --tp-comm-overlap, which is "
                                                   "refused"),
    FlagRow(("--cuda-graph-impl",), {"choices": megatron_lm_choices(
        "--cuda-graph-impl", ("none", "local", TRANSFORMER_ENGINE))}, "none", _CUDA_GRAPH_WHY),
    FlagRow(("--cuda-graph-scope",), {"nargs": "+"}, None, _CUDA_GRAPH_WHY),
    FlagRow(("--te-rng-tracker",), SWITCH, False,
            "dropout draws from this fork's own RNG tracker (the same masks on any parallel "
            "layout); Transformer Engine's tracker is not used"),
    FlagRow(("--batch-size",), {"type": int}, None,
            _REMOVED_WHY.format(instead="use --micro-batch-size instead")),
    FlagRow(("--warmup",), {"type": int}, None,
            _REMOVED_WHY.format(instead="use one of the --lr-warmup-* flags instead")),
    FlagRow(("--model-parallel-size",), {"type": int}, None,
            _REMOVED_WHY.format(instead="use --tensor-model-parallel-size instead")),
    FlagRow(("--checkpoint-activations",), SWITCH, False,
            _REMOVED_WHY.format(instead="use --recompute-activations, or, for more control, "
                                        "--recompute-granularity and --recompute-method")),
)
# Deprecated aliases of --cuda-graph-impl (Megatron-LM's warning names the replacement).
CUDA_GRAPH_ALIASES = {"--enable-cuda-graph": "local",
                      "--external-cuda-graph": TRANSFORMER_ENGINE}


def transformer_engine_installed() -> bool:
    """Whether Transformer Engine is importable (found without importing it or megatron.core:
    the flag layer stays light; the model side asks ``accelerator.te_available``, which also
    needs CUDA and imports TE's attention)."""
    return is_importable(_TE_PACKAGE)


def add_kernel_args(parser: argparse.ArgumentParser) -> None:
    """Registers the kernel/fusion/implementation flags and the refused ones."""
    _add_fusion_switches(parser.add_argument_group("Megatron-LM fusion switches"))
    _add_honoured_kernel_flags(parser.add_argument_group("Megatron-LM kernel flags"))
    _add_deprecated_flags(parser.add_argument_group("Megatron-LM deprecated aliases"))
    refused = parser.add_argument_group("Megatron-LM kernel flags refused here")
    add_flag_rows(refused, REFUSED_FLAGS)
    # Megatron-LM's switch off of a default-on FP8 field, checked on its own: its line names
    # both its spellings.
    refused.add_argument("--no-fp8-wgrad", "--disable-fp8-wgrad", action="store_false",
                         dest="fp8_wgrad", help=f"Refused: {_FP8_WHY}.")


def _add_fusion_switches(group) -> None:
    """Megatron-LM's --no-*-fusion switches (their dests and defaults: on)."""
    group.add_argument("--no-bias-dropout-fusion", action="store_false",
                       dest="bias_dropout_fusion",
                       help="Never fuse bias-dropout-add (TransformerConfig.bias_dropout_fusion "
                            "False, as Megatron-LM). By default it is fused on CUDA where the "
                            "compiled kernel gives the unfused numbers (probed).")
    for flag, dest, kernel in (
            ("--no-masked-softmax-fusion", "masked_softmax_fusion",
             "the CUDA-extension scale-mask-softmax (the attentions here do their own softmax)"),
            ("--no-bias-gelu-fusion", "bias_gelu_fusion",
             "the fused bias-GELU (Megatron-LM's uses the tanh approximation; here GELU is "
             "exact, torch's)"),
            ("--no-bias-swiglu-fusion", "bias_swiglu_fusion", "the fused bias-SwiGLU"),
            ("--no-rope-fusion", "apply_rope_fusion",
             "Transformer Engine's fused RoPE (the packed RoPE table is used)"),
            ("--no-gradient-accumulation-fusion", "gradient_accumulation_fusion",
             "APEX/Transformer Engine's fused weight-gradient accumulation")):
        group.add_argument(flag, action="store_false", dest=dest,
                           help=f"Disables {kernel}: {_UNFUSED}.")
    group.add_argument("--no-persist-layer-norm", action="store_true",
                       help=f"Disables APEX's persistent layer-norm kernel (the norms here are "
                            f"plain torch): {_UNFUSED}.")


def _add_honoured_kernel_flags(group) -> None:
    group.add_argument("--cross-entropy-loss-fusion", action="store_true",
                       help="The LM loss by megatron-core's fused vocab-parallel cross entropy "
                            "(TransformerConfig.cross_entropy_loss_fusion, as Megatron-LM): the "
                            "same loss within float rounding.")
    group.add_argument("--cross-entropy-fusion-impl", default=NATIVE, choices=(NATIVE, TE_IMPL),
                       help="Which fused cross entropy --cross-entropy-loss-fusion uses: "
                            "megatron-core's own (native) or Transformer Engine's (te, needs it "
                            "installed).")
    group.add_argument("--disable-bf16-reduced-precision-matmul", action="store_true",
                       help="With --bf16, CUDA matmuls reduce in full precision "
                            "(torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction "
                            "False, set by megatron-core's TransformerConfig as in Megatron-LM).")
    group.add_argument("--transformer-impl", default=TRANSFORMER_ENGINE,
                       choices=(LOCAL_IMPL, TRANSFORMER_ENGINE, INFERENCE_OPTIMIZED),
                       help="TransformerConfig.transformer_impl, as Megatron-LM. The layers here "
                            "are megatron-core's local linear layers with this fork's norms and "
                            "--attention-backend's attention either way (the same math: "
                            f"local and {TRANSFORMER_ENGINE} train the same losses); "
                            f"{INFERENCE_OPTIMIZED} is refused.")
    group.add_argument("--moe-grouped-gemm", action="store_true",
                       help="Accepted; changes nothing here: the experts run as megatron-core's "
                            "SequentialMLP, one GEMM per expert, the same math as a grouped "
                            "GEMM (the same losses).")
    group.add_argument("--moe-permute-fusion", action="store_true",
                       help="Transformer Engine's fused token permutation in the MoE dispatcher "
                            "(TransformerConfig.moe_permute_fusion, as Megatron-LM; needs "
                            "Transformer Engine).")
    group.add_argument("--moe-router-fusion", action="store_true",
                       help="Transformer Engine's fused top-k routing and aux-loss scores "
                            "(TransformerConfig.moe_router_fusion, as Megatron-LM; needs "
                            "Transformer Engine).")
    group.add_argument("--rope-type", default=None, choices=(ROPE, "yarn"),
                       help="rope (changes nothing: the RoPE of --position-embedding-type rope); "
                            "yarn with --multi-latent-attention only (MLA's default when "
                            "unset), as Megatron-LM refuses it for standard attention.")
    group.add_argument("--use-flash-attn", action="store_true",
                       help=f"{_NO_OP_IN_MEGATRON_LM}; --attention-backend picks the attention.")
    group.add_argument("--openai-gelu", action="store_true",
                       help=f"{_NO_OP_IN_MEGATRON_LM} (its legacy models did).")
    # Megatron-LM's type=bool: any given text (even "False") reads True; nothing reads it.
    group.add_argument("--onnx-safe", type=bool, default=None,
                       help=f"{_NO_OP_IN_MEGATRON_LM} (its legacy models did).")


def _add_deprecated_flags(group) -> None:
    group.add_argument("--use-mcore-models", action="store_true",
                       dest="deprecated_use_mcore_models",
                       help="DEPRECATED and ignored, as in Megatron-LM: megatron-core models are "
                            "the only ones.")
    group.add_argument("--use-rotary-position-embeddings", action="store_true",
                       help="Deprecated: --position-embedding-type rope (which it sets, as "
                            "Megatron-LM).")
    group.add_argument("--no-position-embedding", action="store_false",
                       dest="add_position_embedding",
                       help="Deprecated: use --position-embedding-type. Megatron-LM accepts it "
                            "only beside --position-embedding-type rope, where it changes "
                            "nothing.")
    for flag, impl in CUDA_GRAPH_ALIASES.items():
        group.add_argument(flag, action="store_true",
                           help=f"Deprecated: --cuda-graph-impl {impl} (refused like it).")


def validate_kernel_args(args: argparse.Namespace, require) -> None:
    """Resolves the deprecated aliases as Megatron-LM's validate_args does; refuses what cannot
    be honoured (``require(cond, message)``). Runs before the position-embedding checks of the
    other flag groups, which then see the resolved type."""
    _resolve_cuda_graph_aliases(args, require)
    require(args.fp8_wgrad, f"--no-fp8-wgrad / --disable-fp8-wgrad is not supported: {_FP8_WHY}")
    refuse_given(args, REFUSED_FLAGS, require)
    _resolve_position_embedding_aliases(args, require)
    require(args.rope_type in (None, ROPE) or args.multi_latent_attention,
            f"--rope-type {args.rope_type} is not supported: standard attention takes rope "
            f"only (yarn needs --multi-latent-attention)")
    require(args.transformer_impl != INFERENCE_OPTIMIZED,
            f"--transformer-impl {INFERENCE_OPTIMIZED} is not supported: it builds inference "
            f"layers; use {TRANSFORMER_ENGINE} (the default) or {LOCAL_IMPL}")
    _require_transformer_engine(args, require)


def _resolve_cuda_graph_aliases(args, require) -> None:
    """Megatron-LM: each alias stands for a --cuda-graph-impl (never given beside it), refused
    here like it: one line naming both."""
    for flag, impl in CUDA_GRAPH_ALIASES.items():
        if getattr(args, dest_of(flag, {})):
            require(False, f"{flag} (deprecated, use --cuda-graph-impl={impl} instead) is not "
                           f"supported: {_CUDA_GRAPH_WHY}")


def _resolve_position_embedding_aliases(args, require) -> None:
    # Megatron-LM sets rope without a word (megatron-wrap's views carry the key routinely)
    if args.use_rotary_position_embeddings:
        args.position_embedding_type = ROPE
    # Megatron-LM's own words (a RuntimeError there)
    require(args.add_position_embedding or args.position_embedding_type == ROPE,
            f"--no-position-embedding is deprecated, use --position-embedding-type (it is "
            f"{args.position_embedding_type}; Megatron-LM accepts the flag only beside rope)")


def _require_transformer_engine(args, require) -> None:
    """The honoured flags whose kernels are Transformer Engine's: one line when it is absent
    (megatron-core would raise in the first step, or at model build)."""
    asked = {"--moe-permute-fusion": args.moe_permute_fusion,
             "--moe-router-fusion": args.moe_router_fusion,
             f"--cross-entropy-fusion-impl {TE_IMPL}": (args.cross_entropy_loss_fusion
                                                        and args.cross_entropy_fusion_impl
                                                        == TE_IMPL)}
    for flag, wanted in asked.items():
        require(not wanted or transformer_engine_installed(),
                f"{flag} is not supported: its kernel is Transformer Engine's, which is not "
                f"installed")
