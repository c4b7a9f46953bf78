"""Activation recomputation flags (Megatron-LM's names and semantics) and their checks.

- ``--recompute-granularity full``: each recomputed transformer (or hybrid) layer keeps only its
  input; backward runs its forward again. Needs ``--recompute-method`` and
  ``--recompute-num-layers``: ``uniform`` checkpoints groups of N consecutive layers (N must
  divide the layers of each model chunk), ``block`` recomputes the first N layers of each chunk
  and keeps the rest.
- ``--recompute-granularity selective``: only the modules ``--recompute-modules`` names, in every
  layer: megatron-core 0.16.1's whole list (:data:`RECOMPUTE_MODULES`; default ``core_attn``).
  Each module is checked against the model here, as megatron-core checks its config, so that a
  module that cannot run, or would recompute nothing, is refused in one line.
- ``--recompute-activations``: Megatron-LM's shorthand for ``--recompute-granularity selective``.
- ``--moe-layer-recompute``: megatron-core's deprecated form of ``--recompute-modules moe``
  (selective, ``moe`` added to the modules; not with ``full``).

Recomputation never changes the numbers: the recomputed forward gets the micro-batch's own
``packed_seq_params`` (so its CP group, attention plan and boundaries) through megatron-core's
checkpoint closure, and ``tensor_parallel.checkpoint`` restores the RNG states (dropout masks).
See docs/RECOMPUTE.md.
"""

from __future__ import annotations

from megatron.varlen.model import moe_layer_pattern
from megatron.varlen_training.config import model as layer_symbols
from megatron.varlen_training.log import warning_rank_0
from megatron.varlen_training.moe_arguments import moe_layer_freq_text
from megatron.varlen_training.pipeline_arguments import pipeline_split_of

FULL, SELECTIVE = "full", "selective"
UNIFORM, BLOCK = "uniform", "block"
CORE_ATTN, MOE_ACT, LAYERNORM, MLA_UP_PROJ = "core_attn", "moe_act", "layernorm", "mla_up_proj"
MLP, MOE, SHARED_EXPERTS = "mlp", "moe", "shared_experts"
# megatron-core 0.16.1's TransformerConfig.recompute_modules choices, in its order.
RECOMPUTE_MODULES = (CORE_ATTN, MOE_ACT, LAYERNORM, MLA_UP_PROJ, MLP, MOE, SHARED_EXPERTS)
DEFAULT_RECOMPUTE_MODULES = (CORE_ATTN,)
# megatron-core's MTP block checkpoints one MTP layer at a time under "uniform".
MTP_UNIFORM_LAYERS = 1


def add_recompute_args(parser) -> None:
    group = parser.add_argument_group("activation recomputation")
    group.add_argument("--recompute-granularity", default=None, choices=[FULL, SELECTIVE],
                       help="full: recompute whole layers in backward (with --recompute-method "
                            "and --recompute-num-layers); selective: recompute only "
                            "--recompute-modules in every layer.")
    group.add_argument("--recompute-method", default=None, choices=[UNIFORM, BLOCK],
                       help="With --recompute-granularity full: uniform checkpoints groups of "
                            "--recompute-num-layers layers; block recomputes the first "
                            "--recompute-num-layers layers of each pipeline stage.")
    group.add_argument("--recompute-num-layers", type=int, default=None,
                       help="Layers per recomputed group (uniform) or recomputed layers per "
                            "pipeline stage (block).")
    group.add_argument("--recompute-modules", nargs="+", default=None,
                       choices=list(RECOMPUTE_MODULES),
                       help="With --recompute-granularity selective: the submodules to "
                            "recompute in every layer (default core_attn). core_attn: the "
                            "attention core; mlp: the dense MLP; moe: the MoE layer; "
                            "shared_experts: the MoE layer's shared experts; layernorm: the "
                            "input and pre-MLP norms; mla_up_proj: MLA's up projections and "
                            "RoPE; moe_act: refused here (grouped-GEMM experts only).")
    group.add_argument("--recompute-activations", action="store_true",
                       help="Shorthand for --recompute-granularity selective.")
    group.add_argument("--moe-layer-recompute", action="store_true",
                       help="Deprecated (megatron-core): --recompute-granularity selective "
                            "with moe added to --recompute-modules.")


def _chunk_sizes(args) -> list[int]:
    """The distinct layer counts of the model chunks that hold layers (megatron-core's split;
    a chunk left without layers, the embedding or loss counted as one, recomputes nothing)."""
    chunks = pipeline_split_of(args).chunk_layers()
    return sorted({count for stage in chunks for count in stage if count > 0})


def _validate_full(args, require) -> None:
    require(args.recompute_method is not None,
            "--recompute-granularity full needs --recompute-method (uniform or block)")
    sizes = _chunk_sizes(args)
    layers, which = max(sizes), "each" if len(sizes) == 1 else "the largest"
    count = args.recompute_num_layers
    require(count is not None,
            f"--recompute-granularity full needs --recompute-num-layers (1 to the {layers} "
            f"layers of {which} pipeline stage)")
    require(count <= layers,
            f"--recompute-num-layers {count} exceeds the {layers} layers of {which} model chunk "
            f"(--num-layers / --pipeline-model-parallel-size, or "
            f"--num-layers-per-virtual-pipeline-stage, or the uneven stage flags)")
    if args.recompute_method == UNIFORM:
        # megatron-core checkpoints groups of `count` layers from each chunk's first and
        # indexes past a chunk whose size it does not divide
        layers = next((size for size in sizes if size % count), layers)
        require(layers % count == 0,
                f"--recompute-method uniform: --recompute-num-layers {count} does not divide the "
                f"{layers} layers of {'each' if len(sizes) == 1 else 'a'} model chunk (choose "
                f"a divisor, or --recompute-method block)")
        if args.mtp_num_layers:
            _validate_mtp_uniform(args, require, count)


def _validate_mtp_uniform(args, require, count: int) -> None:
    """megatron-core 0.16.1 recomputes MTP layers only under "uniform", one at a time, and hands
    ``packed_seq_params`` to ``tensor_parallel.checkpoint`` as an input to save, which takes
    tensors only: a packed run would fail at its first backward."""
    require(not args.sequence_packing,
            "--recompute-method uniform with --mtp-num-layers and --sequence-packing: "
            "megatron-core 0.16.1's MTP recomputation saves packed_seq_params as a tensor and "
            "fails; use --recompute-method block (MTP layers keep their activations) or "
            "--recompute-granularity selective")
    # Unpacked, the MTP MoE layers' padding mask comes from VarlenGPTModel.forward (megatron-core
    # does not pass it) and is gone when backward recomputes the layer: its balancing losses
    # would be recomputed over padding (probed: grad norm 0.69 without recomputation, 1.09 with).
    require(args.num_experts is None,
            "--recompute-method uniform with --mtp-num-layers and --num-experts "
            f"{args.num_experts} without --sequence-packing: megatron-core 0.16.1's MTP "
            "recomputation does not hand the MTP layer its padding mask, so the router's "
            "balancing losses would be recomputed over padding (wrong gradients); use "
            "--recompute-method block (MTP layers keep their activations) or "
            "--recompute-granularity selective")
    require(count == MTP_UNIFORM_LAYERS,
            f"--recompute-method uniform with --mtp-num-layers needs --recompute-num-layers "
            f"{MTP_UNIFORM_LAYERS} (megatron-core recomputes MTP layers one at a time), got "
            f"{count}")


def _validate_selective(args, require) -> None:
    require(args.recompute_method is None,
            f"--recompute-method {args.recompute_method} is for --recompute-granularity full "
            f"(selective recomputes --recompute-modules in every layer)")
    require(args.recompute_num_layers is None,
            f"--recompute-num-layers {args.recompute_num_layers} is for --recompute-granularity "
            f"full (selective recomputes --recompute-modules in every layer)")


# Why each module cannot run on this model (None: it can), megatron-core 0.16.1's own checks
# first. A module that would recompute nothing is refused too: the flag would silently do nothing.
def _mlp_problem(args) -> str | None:
    # megatron-core 0.16.1 checkpoints the MLP's (output, output bias) pair: the bias is a
    # parameter, and returning it from the checkpoint gives the parameter itself a grad_fn
    # (backward then recurses without end). Without biases there is no such output.
    if not args.disable_bias_linear:
        return ("needs --disable-bias-linear (megatron-core 0.16.1 returns the MLP's bias "
                "parameter from its checkpoint, which breaks backward)")
    return None


def _moe_problem(args) -> str | None:
    if args.num_experts is None:
        return ("recomputes MoE layers and this model has none (--num-experts); use mlp for "
                "the dense MLP")
    return None


def _shared_experts_problem(args) -> str | None:
    if args.num_experts is None or args.moe_shared_expert_intermediate_size is None:
        return ("recomputes the MoE layers' shared experts and this model has none "
                "(--num-experts with --moe-shared-expert-intermediate-size); use moe or mlp")
    if args.moe_shared_expert_overlap:
        return ("cannot work with --moe-shared-expert-overlap (megatron-core 0.16.1: the "
                "overlapped shared experts run inside the token dispatcher); drop one")
    return None


def _moe_act_problem(args) -> str | None:
    # megatron-core recomputes the expert activation only in its grouped-GEMM experts (TE or
    # the grouped_gemm package); the experts here are its SequentialMLP, whatever
    # --moe-grouped-gemm says (kernel_arguments.py).
    return ("recomputes the activation of grouped-GEMM experts only (megatron-core 0.16.1), and "
            "the experts here run as megatron-core's SequentialMLP; use moe (the whole MoE "
            "layer, activations included)")


def _mla_up_proj_problem(args) -> str | None:
    if not args.multi_latent_attention:
        return ("is only supported with --multi-latent-attention (megatron-core 0.16.1); use "
                "core_attn")
    return None


MODULE_PROBLEMS = {MLP: _mlp_problem, MOE: _moe_problem, SHARED_EXPERTS: _shared_experts_problem,
                   MOE_ACT: _moe_act_problem, MLA_UP_PROJ: _mla_up_proj_problem}

# The decoder layers (hybrid pattern symbols) each module recomputes something in, and what it
# is there; Mamba layers have no selective recomputation (megatron-core 0.16.1).
MODULE_LAYERS = {
    CORE_ATTN: (layer_symbols.ATTENTION, "attention layers"),
    MLP: (layer_symbols.MLP, "dense MLP layers"),
    MOE: (layer_symbols.MOE, "MoE layers"),
    SHARED_EXPERTS: (layer_symbols.MOE, "MoE layers"),
    MOE_ACT: (layer_symbols.MOE, "MoE layers"),
    LAYERNORM: (layer_symbols.ATTENTION + layer_symbols.MLP + layer_symbols.MOE,
                "attention, MLP or MoE layers"),
    MLA_UP_PROJ: (layer_symbols.ATTENTION, "attention layers"),
}
ALTERNATIVES = {layer_symbols.MLP: MLP, layer_symbols.MOE: MOE}


def gpt_layer_kinds(args) -> str:
    """The hybrid pattern symbols of a GPT model's decoder layers: attention in every layer, a
    dense MLP or MoE by ``--moe-layer-freq`` (MTP layers are built like the last layer)."""
    if args.num_experts is None:
        return layer_symbols.ATTENTION + layer_symbols.MLP
    moe = moe_layer_pattern(args.moe_layer_freq, args.num_layers)
    return (layer_symbols.ATTENTION + (layer_symbols.MOE if any(moe) else "")
            + (layer_symbols.MLP if not all(moe) else ""))


def refuse_modules_without_layers(args, require, layer_kinds: str, layers_flag: str) -> None:
    """Selective recomputation of a module none of the model's layers has would recompute
    nothing (megatron-core skips it silently): refused in one line naming what the layers
    have. ``layer_kinds``: the pattern symbols present; ``layers_flag``: the flag saying so."""
    if args.recompute_granularity != SELECTIVE:
        return
    instead = dict.fromkeys(ALTERNATIVES[kind] for kind in layer_kinds if kind in ALTERNATIVES)
    hint = f"; use {' or '.join(instead)}" if instead else ""
    for module in args.recompute_modules:
        symbols, what = MODULE_LAYERS[module]
        require(any(symbol in layer_kinds for symbol in symbols),
                f"--recompute-modules {module} recomputes {what} and {layers_flag} gives this "
                f"model none{hint}")


def _validate_modules(args, require) -> None:
    for module in args.recompute_modules:
        problem = MODULE_PROBLEMS.get(module, lambda _: None)(args)
        require(problem is None, f"--recompute-modules {module} {problem}")


def _resolve_moe_layer_recompute(args, require) -> None:
    """megatron-core 0.16.1's ``moe_layer_recompute``: selective, ``moe`` added to the modules
    (its deprecation warning, with the module name it means)."""
    require(args.recompute_granularity != FULL,
            "Do not set --moe-layer-recompute with full recompute granularity "
            "(--recompute-granularity full recomputes whole layers, MoE included)")
    require(args.num_experts is not None,
            "--moe-layer-recompute recomputes MoE layers and this model has none (--num-experts)")
    warning_rank_0("--moe-layer-recompute is deprecated. Use --recompute-granularity selective "
                   "--recompute-modules moe instead.")
    args.recompute_granularity = SELECTIVE
    args.recompute_modules = [*(args.recompute_modules or DEFAULT_RECOMPUTE_MODULES), MOE]


def validate_recompute_args(args, require) -> None:
    """Resolves ``--recompute-activations`` and ``recompute_modules``; checks the combination."""
    if args.recompute_activations:
        require(args.recompute_granularity in (None, SELECTIVE),
                f"--recompute-activations means --recompute-granularity selective, but "
                f"--recompute-granularity {args.recompute_granularity} was given")
        args.recompute_granularity = SELECTIVE
    if args.moe_layer_recompute:
        _resolve_moe_layer_recompute(args, require)
    granularity = args.recompute_granularity
    if granularity == FULL:
        _validate_full(args, require)
    elif granularity == SELECTIVE:
        _validate_selective(args, require)
    else:
        for flag, value in (("--recompute-method", args.recompute_method),
                            ("--recompute-num-layers", args.recompute_num_layers)):
            require(value is None, f"{flag} needs --recompute-granularity")
    require(args.recompute_modules is None or granularity == SELECTIVE,
            "--recompute-modules needs --recompute-granularity selective")
    modules = args.recompute_modules or DEFAULT_RECOMPUTE_MODULES
    args.recompute_modules = tuple(dict.fromkeys(modules))  # given order, no repeats
    if granularity == SELECTIVE:
        _validate_modules(args, require)
        if not is_hybrid(args):  # pretrain_mamba.py checks against its pattern once resolved
            refuse_modules_without_layers(
                args, require, gpt_layer_kinds(args),
                f"--moe-layer-freq {moe_layer_freq_text(args.moe_layer_freq)}")


def is_hybrid(args) -> bool:
    """Whether the flags are pretrain_mamba.py's (its parser adds the hybrid pattern)."""
    return hasattr(args, "hybrid_override_pattern")
