"""Megatron-LM's model and precision flags that its ``core_transformer_config_from_args`` maps to
megatron-core's TransformerConfig (or its GPTModel / DDP), beyond the network-size group of
arguments.py: honoured with Megatron-LM's defaults and semantics, or refused in one line.

Megatron-LM copies every flag whose name is a TransformerConfig field into the config, so a flag
this fork did not know built another model than Megatron-LM's for the same command line (or, as
"unrecognized", gave no reason). The honoured flags below change the built model exactly as in
Megatron-LM (tests/unit_tests/varlen_training/test_transformer_config_reference.py compares the
config field by field with a reference written from Megatron-LM's facts). A refused flag is
still registered, so that a Megatron-LM command line carrying it gets one line naming the flag
and why (exit 2); each keeps Megatron-LM's default as the value that changes nothing.
"""

from __future__ import annotations

import argparse
import os

from megatron.varlen_training.flag_ranges import gated_mlp, layer_pattern_problem
from megatron.varlen_training.moe_arguments import layer_freq_type
from megatron.varlen_training.refused_flags import (
    SWITCH, FlagRow, add_flag_rows, dest_of, refuse_given,
)
from megatron.varlen_training.varlen_arguments import attention_backend

# Transformer Engine reads query-key layer scaling from this variable only; megatron-core's TE
# attention refuses a config that disagrees with it (a traceback at model build).
TE_QK_SCALING_VARIABLE = "NVTE_APPLY_QK_LAYER_SCALING"

FP32 = "fp32"
NO_ROPE_FLAG = "--no-rope-freq"
# megatron-core's softmax_type choices: no sink, a zero sink logit, a learned one per head.
SOFTMAX_TYPES = ("vanilla", "off-by-one", "learnable")
MTP_LOSS_SCALING_DEFAULT = 0.1  # Megatron-LM's (and TransformerConfig's) --mtp-loss-scaling-factor
# Megatron-LM's choices of --main-grads-dtype, --main-params-dtype and the Adam moments'.
OPTIMIZER_DTYPE_CHOICES = ("fp32", "bf16", "fp16", "fp8")
# The state dtypes of Megatron-LM's precision-aware optimizer (fp32 unless that optimizer is used).
OPTIMIZER_DTYPE_FLAGS = ("--main-grads-dtype", "--main-params-dtype", "--exp-avg-dtype",
                         "--exp-avg-sq-dtype")
_PRECISION_AWARE_WHY = ("Megatron-LM's precision-aware optimizer is Transformer Engine's "
                        "FusedAdam, which this fork does not build: the optimizer keeps fp32 "
                        "main grads, main params and Adam moments (Megatron-LM's default)")
_LOW_BITS_WHY = "{bits} needs Transformer Engine's {bits} layers, which this fork does not build"
REFUSED_FLAGS = (
    FlagRow(("--use-precision-aware-optimizer",), SWITCH, False, _PRECISION_AWARE_WHY),
    FlagRow(("--apply-residual-connection-post-layernorm",), SWITCH, False,
            "megatron-core's TransformerLayer does not implement it (Megatron-LM sets the config "
            "field and still builds pre-norm residuals): drop the flag"),
    FlagRow(("--rotary-interleaved",), SWITCH, False,
            "the packed RoPE here rotates halves (megatron-core's default), not interleaved pairs"),
    FlagRow(("--init-method-xavier-uniform",), SWITCH, False,
            "weights are initialised from --init-method-std here (normal, layout-invariant)"),
    FlagRow(("--fp32-residual-connection",), SWITCH, False,
            "residuals stay in the parameters' dtype here"),
    FlagRow(("--attention-output-gate",), SWITCH, False,
            "gated attention outputs are not built here"),
    FlagRow(("--qk-l2-norm",), SWITCH, False,
            "queries and keys are not L2-normalised here (--qk-layernorm is)"),
    FlagRow(("--qk-clip",), SWITCH, False, "QK-clip is not implemented here"),
    FlagRow(("--embedding-init-method-std",), {"type": float}, None,
            "the word embedding initialises from --init-method-std here (layout-invariant init)"),
    FlagRow(("--fp8-format",), {"dest": "fp8"}, None, _LOW_BITS_WHY.format(bits="FP8")),
    FlagRow(("--fp4-format",), {"dest": "fp4"}, None, _LOW_BITS_WHY.format(bits="FP4")),
    FlagRow(("--moe-input-jitter-eps",), {"type": float}, None,
            "router input jitter draws noise per token, which packing and the CP layout would "
            "change"),
    FlagRow(("--moe-router-force-load-balancing",), SWITCH, False,
            "a benchmarking mode that routes to random experts"),
    FlagRow(("--moe-shared-expert-gate",), SWITCH, False, "the shared expert here is not gated"),
    FlagRow(("--moe-apply-probs-on-input",), SWITCH, False,
            "the router's probabilities scale the experts' outputs here"),
    FlagRow(("--moe-latent-size",), {"type": int}, None, "latent MoE is not built here"),
    FlagRow(("--fp16-lm-cross-entropy",), SWITCH, False,
            "megatron-core 0.16.1's GPTModel keeps it but never reads it (its vocab-parallel "
            "cross entropy runs in fp32 either way): drop the flag"),
)


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """Registers the honoured and the refused Megatron-LM model/precision flags."""
    group = parser.add_argument_group("Megatron-LM model and precision flags")
    group.add_argument("--rotary-percent", type=float, default=1.0,
                       help="Share of each head's channels RoPE rotates (the rest pass through), "
                            "as Megatron-LM's.")
    group.add_argument("--rotary-seq-len-interpolation-factor", type=int, default=None,
                       help="RoPE positions divided by this factor (linear position "
                            "interpolation), as Megatron-LM's.")
    group.add_argument("--mtp-loss-scaling-factor", type=float, default=MTP_LOSS_SCALING_DEFAULT,
                       help="Weight of the multi-token-prediction loss (split over the "
                            "--mtp-num-layers depths) added to the LM loss, as Megatron-LM's.")
    group.add_argument("--attention-softmax-in-fp32", action="store_true",
                       help="TransformerConfig.attention_softmax_in_fp32 (Megatron-LM's "
                            "default False). Our local and flash attentions compute the "
                            "softmax in fp32 either way; megatron-core's DotProductAttention "
                            "(a --spec) reads it.")
    group.add_argument("--apply-query-key-layer-scaling", action="store_true",
                       help="Scale Q.K by 1/layer number inside the fp16 softmax (the same "
                            "math; sets --attention-softmax-in-fp32, as Megatron-LM's).")
    # Megatron-LM's dest is the TransformerConfig field's name.
    group.add_argument("--apply-layernorm-1p", action="store_true",
                       dest="layernorm_zero_centered_gamma",
                       help="Zero-centered norm weights: every LayerNorm/RMSNorm stores "
                            "gamma - 1 (initialised to 0) and scales by stored + 1, as "
                            "Megatron-LM's.")
    group.add_argument("--accumulate-allreduce-grads-in-fp32", action="store_true",
                       help="Accumulate and all-reduce gradients in fp32 (always with --bf16, "
                            "as Megatron-LM; with --fp16 only with this flag).")
    group.add_argument("--softmax-type", choices=SOFTMAX_TYPES, default=SOFTMAX_TYPES[0],
                       help="Attention softmax: vanilla, off-by-one (a zero logit joins every "
                            "row: exp(s)/(1 + sum exp)) or learnable (one learned sink logit "
                            "per head, gpt-oss's), as megatron-core's. Not with --attention-"
                            "backend flash (auto picks local).")
    group.add_argument("--no-rope-freq", type=layer_freq_type(NO_ROPE_FLAG), default=None,
                       help="Layers that skip RoPE (Llama-4's NoPE layers), as Megatron-LM's: "
                            "an int N skips it on every N-th layer (N divides --num-layers), a "
                            "0/1 list or pattern such as ([0]*3+[1]*1)*2 marks them with 1.")
    group.add_argument("--glu-linear-offset", type=float, default=0.0,
                       help="A gated MLP computes act(gate) * (linear + this) (Megatron-LM's "
                            "TransformerConfig field; gpt-oss uses 1).")
    group.add_argument("--activation-func-clamp-value", type=float, default=None,
                       help="A gated MLP clamps its gate half to at most this and its linear "
                            "half to [-this, this] before the activation (Megatron-LM's "
                            "TransformerConfig field; gpt-oss uses 7). Default: no clamp.")
    for flag in OPTIMIZER_DTYPE_FLAGS:
        group.add_argument(flag, default=FP32, choices=OPTIMIZER_DTYPE_CHOICES,
                           help=f"Megatron-LM's precision-aware optimizer state dtype: only "
                                f"{FP32} (its default) here.")
    # Megatron-LM's default: the value that changes nothing (a megatron-wrap view lists it)
    add_flag_rows(parser.add_argument_group("Megatron-LM model flags refused here"),
                  REFUSED_FLAGS)


def validate_model_args(args: argparse.Namespace, require) -> None:
    """Refuses what cannot be honoured; resolves the derived precision fields as Megatron-LM's
    validate_args does (``require(cond, message)``)."""
    refuse_given(args, REFUSED_FLAGS, require)
    for flag in OPTIMIZER_DTYPE_FLAGS:
        value = getattr(args, dest_of(flag, {}))
        require(value == FP32, f"{flag} {value} is not supported (only {FP32}): "
                               f"it needs --use-precision-aware-optimizer; "
                               f"{_PRECISION_AWARE_WHY}")
    require(args.position_embedding_type == "rope"
            or (args.rotary_percent == 1.0 and args.rotary_seq_len_interpolation_factor is None),
            f"--rotary-percent {args.rotary_percent} / --rotary-seq-len-interpolation-factor "
            f"{args.rotary_seq_len_interpolation_factor} need --position-embedding-type rope "
            f"(got {args.position_embedding_type})")
    for flag, value, unset in (("--glu-linear-offset", args.glu_linear_offset, 0.0),
                               ("--activation-func-clamp-value",
                                args.activation_func_clamp_value, None)):
        # megatron-core reads both in its gated MLP only: elsewhere they would do nothing
        require(value == unset or gated_mlp(args),
                f"{flag} {value} acts on a gated MLP: it needs --swiglu or --quick-geglu")
    require(args.mtp_num_layers or args.mtp_loss_scaling_factor == MTP_LOSS_SCALING_DEFAULT,
            f"--mtp-loss-scaling-factor {args.mtp_loss_scaling_factor} weights the "
            f"multi-token-prediction loss, which needs --mtp-num-layers")
    _check_no_rope_layers(args, require)
    _check_te_query_key_scaling(args, require)
    if args.apply_query_key_layer_scaling:  # megatron-core's TransformerConfig does the same
        args.attention_softmax_in_fp32 = True
    if args.bf16:  # Megatron-LM: bfloat16 accumulates and all-reduces gradients in fp32,
        # unless --grad-reduce-in-bf16 (ddp_arguments.py), which wins over the fp32 flag too
        args.accumulate_allreduce_grads_in_fp32 = not args.grad_reduce_in_bf16


def _check_no_rope_layers(args: argparse.Namespace, require) -> None:
    """--no-rope-freq as megatron-core can run it: RoPE to skip, a pattern of the layers'
    length, no layer megatron-core numbers past it (MTP), and not MLA's own RoPE (its
    attention never reads the field: the flag would do nothing)."""
    freq = args.no_rope_freq
    if freq is None:
        return
    require(args.position_embedding_type == "rope",
            f"{NO_ROPE_FLAG} skips RoPE on some layers: it needs --position-embedding-type rope "
            f"(got {args.position_embedding_type})")
    layers = args.num_layers  # a hybrid pattern's count by now (apply_pattern_stages)
    if isinstance(freq, int):
        require(freq >= 1 and layers % freq == 0,
                f"{NO_ROPE_FLAG} {freq} must be >= 1 and divide --num-layers {layers}")
    problem = layer_pattern_problem(NO_ROPE_FLAG, freq, layers)
    require(problem is None, problem)
    require(not args.mtp_num_layers,
            f"{NO_ROPE_FLAG} has no entry for the --mtp-num-layers {args.mtp_num_layers} layers "
            f"(megatron-core numbers them after the decoder's: an IndexError there); drop one")
    require(not getattr(args, "multi_latent_attention", False),
            f"{NO_ROPE_FLAG} is not read by multi-latent attention (its RoPE would run on "
            f"every layer): drop it or --multi-latent-attention")


def _check_te_query_key_scaling(args: argparse.Namespace, require) -> None:
    """Transformer Engine's attention takes query-key layer scaling from
    NVTE_APPLY_QK_LAYER_SCALING only, and megatron-core's refuses a config that disagrees with
    it (a traceback at model build; Megatron-LM leaves the match to the user): one line now."""
    wanted = args.apply_query_key_layer_scaling
    scaling = os.environ.get(TE_QK_SCALING_VARIABLE, "0")
    if wanted == (scaling not in ("", "0")):
        return
    try:
        backend = attention_backend(args)
    except ValueError:  # an impossible backend: varlen_arguments says so in its own line
        return
    require(backend != "te",
            f"Transformer Engine's attention takes query-key layer scaling from "
            f"{TE_QK_SCALING_VARIABLE} (it is {scaling!r}), which must agree with "
            f"--apply-query-key-layer-scaling ({'given' if wanted else 'not given'}): set "
            f"{TE_QK_SCALING_VARIABLE}={int(wanted)}, as in Megatron-LM, or use "
            f"--attention-backend local/flash")
