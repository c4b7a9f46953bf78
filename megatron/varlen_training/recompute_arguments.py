"""Activation recomputation flags (Megatron-LM's names and semantics) and their checks.

- ``--recompute-granularity full``: each recomputed transformer (or hybrid) layer keeps only its
  input; backward runs its forward again. Needs ``--recompute-method`` and
  ``--recompute-num-layers``: ``uniform`` checkpoints groups of N consecutive layers (N must
  divide the layers of each model chunk), ``block`` recomputes the first N layers of each chunk
  and keeps the rest.
- ``--recompute-granularity selective``: only the modules ``--recompute-modules`` names, in every
  layer (default ``core_attn``: the attention core, whose saved probabilities grow with the
  square of the sequence in the reference backend; ``mlp``: the dense MLP). No method, no count.
- ``--recompute-activations``: Megatron-LM's shorthand for ``--recompute-granularity selective``.

Recomputation never changes the numbers: the recomputed forward gets the micro-batch's own
``packed_seq_params`` (so its CP group, attention plan and boundaries) through megatron-core's
checkpoint closure, and ``tensor_parallel.checkpoint`` restores the RNG states (dropout masks).
See docs/RECOMPUTE.md.
"""

from __future__ import annotations

from megatron.varlen_training.pipeline_arguments import pipeline_split_of

FULL, SELECTIVE = "full", "selective"
UNIFORM, BLOCK = "uniform", "block"
# megatron-core's recompute_modules that run through tensor_parallel.checkpoint on a dense
# model; the output-discarding ones (layernorm, moe_act) and MLA/MoE modules are not offered.
RECOMPUTE_MODULES = ("core_attn", "mlp")
DEFAULT_RECOMPUTE_MODULES = ("core_attn",)
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
                            "recompute (default core_attn).")
    group.add_argument("--recompute-activations", action="store_true",
                       help="Shorthand for --recompute-granularity selective.")


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


def _validate_modules(args, require) -> None:
    # megatron-core 0.16.1 checkpoints the MLP's (output, output bias) pair: the bias is a
    # parameter, and returning it from the checkpoint gives the parameter itself a grad_fn
    # (backward then recurses without end). Without biases there is no such output.
    require("mlp" not in args.recompute_modules or args.disable_bias_linear,
            "--recompute-modules mlp needs --disable-bias-linear (megatron-core 0.16.1 returns "
            "the MLP's bias parameter from its checkpoint, which breaks backward)")


def validate_recompute_args(args, require) -> None:
    """Resolves ``--recompute-activations`` and ``recompute_modules``; checks the combination."""
    if args.recompute_activations:
        require(args.recompute_granularity in (None, SELECTIVE),
                f"--recompute-activations means --recompute-granularity selective, but "
                f"--recompute-granularity {args.recompute_granularity} was given")
        args.recompute_granularity = SELECTIVE
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
