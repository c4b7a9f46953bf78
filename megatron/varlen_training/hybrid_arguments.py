"""pretrain_mamba.py's command line: every pretrain_gpt.py flag plus Megatron-LM's hybrid flags.

The hybrid group (``--hybrid-layer-pattern`` and its deprecated name
``--hybrid-override-pattern``, ``--hybrid-attention-ratio``, ``--hybrid-mlp-ratio``,
``--mamba-state-dim``, ``--mamba-head-dim``, ``--mamba-num-groups``, ``--mamba-num-heads``,
``--is-hybrid-model``) is added to the GPT parser only for this entry point, so pretrain_gpt.py's
CLI is unchanged. Validation fills two derived fields, once, before anything reads them:
``hybrid_layer_pattern`` (the layer symbols, from the pattern or the ratios) and
``mamba_num_heads_resolved``; the config builders turn them into the run's ``HybridConfig``
(whose attention layers weight the scheduler's quadratic cost term).

Mamba heads must split over every CP group size a micro-batch can get (the static
``--context-parallel-size`` and, under dynamic CP, every size of the group layout): start-up
rejects head counts that a possible size does not divide, in one line. The scheduler itself is
not told about heads.
"""

from __future__ import annotations

import argparse
import sys

from megatron.varlen_training import checkpoint_model_flags, flag_ranges
from megatron.varlen_training.megatron_lm_census_flags import (
    add_hybrid_census_flags, validate_hybrid_census_flags,
)
from megatron.varlen_training.arguments import (
    build_parser, exit_on_flag_errors, require, validate_args,
)
from megatron.varlen_training.config.model import ATTENTION, MAMBA, MLP, MOE
from megatron.varlen_training.log import warning_rank_0
from megatron.varlen_training.recompute_arguments import refuse_modules_without_layers
from megatron.varlen_training.varlen_arguments import possible_cp_sizes

PROG = "pretrain_mamba.py"
SUPPORTED_SYMBOLS = (MAMBA, ATTENTION, MLP, MOE)
MAMBA_EXPAND = 2  # megatron-core's MambaMixer default: d_inner = 2 * hidden size
PIPE = "|"  # Megatron-LM main's pipeline-stage separator in a hybrid pattern


# Megatron-LM's recipes name megatron-core's stock hybrid stack (core 0.16.1's name, then main's
# after the rename); pretrain_mamba.py builds that stack's layers in varlen form, so naming it
# asks for the default.
MEGATRON_CORE_HYBRID_STACK_SPECS = (
    ("megatron.core.models.mamba.mamba_layer_specs", "mamba_stack_spec"),
    ("megatron.core.models.hybrid.hybrid_layer_specs", "hybrid_stack_spec"),
)

def add_hybrid_args(parser: argparse.ArgumentParser) -> None:
    """Megatron-LM's hybrid-model flags (same names and defaults)."""
    group = parser.add_argument_group("hybrid Mamba model")
    group.add_argument("--hybrid-layer-pattern", default=None,
                       help="One symbol per layer: M Mamba, * attention, - MLP, E MoE (e.g. "
                            "M*-M*E), | between pipeline stages; Megatron-LM main's name. "
                            "--num-layers defaults to its layer count (given, it must match).")
    group.add_argument("--hybrid-override-pattern", default=None,
                       help="Deprecated: use --hybrid-layer-pattern (core_v0.16.1's name, "
                            "forwarded to it as Megatron-LM main does).")
    group.add_argument("--hybrid-attention-ratio", type=float, default=0.0,
                       help="Fraction of attention layers when no pattern is given.")
    group.add_argument("--hybrid-mlp-ratio", type=float, default=0.0,
                       help="Fraction of MLP layers when no pattern is given.")
    group.add_argument("--mamba-state-dim", type=int, default=128,
                       help="SSM state size per head (d_state).")
    group.add_argument("--mamba-head-dim", type=int, default=64,
                       help="Channels per Mamba head.")
    group.add_argument("--mamba-num-groups", type=int, default=8,
                       help="B/C groups (heads of a group share B and C).")
    group.add_argument("--mamba-num-heads", type=int, default=None,
                       help="Mamba heads. Default: 2 x hidden size / --mamba-head-dim.")
    group.add_argument("--is-hybrid-model", action="store_true",
                       help="Megatron-LM's mark of a hybrid model (output projections start "
                            "from std / sqrt(layers)); pretrain_mamba.py always builds one, "
                            "so it changes nothing here.")


def build_hybrid_parser() -> argparse.ArgumentParser:
    """pretrain_gpt.py's parser plus the hybrid group, named pretrain_mamba.py."""
    parser = build_parser()
    parser.prog = PROG
    # Megatron-LM main: a --hybrid-layer-pattern gives the layer count (apply_pattern_stages)
    next(action for action in parser.flag_actions
         if "--num-layers" in action.option_strings).required = False
    parser.description = "Megatron hybrid Mamba-Transformer training (varlen fork)"
    add_hybrid_args(parser)
    add_hybrid_census_flags(parser)
    return parser


def _given_pattern(args) -> tuple[str | None, str]:
    """(the pattern as given, the flag that gave it). --hybrid-override-pattern is Megatron-LM
    main's deprecated name of --hybrid-layer-pattern: forwarded, with main's warning; it is
    also the key checkpoints record the given pattern under (resume/consistency.py)."""
    if args.hybrid_override_pattern is None:
        args.hybrid_override_pattern = args.hybrid_layer_pattern
        return args.hybrid_layer_pattern, "--hybrid-layer-pattern"
    require(args.hybrid_layer_pattern in (None, args.hybrid_override_pattern),
            "--hybrid-override-pattern and --hybrid-layer-pattern cannot both be specified. "
            "--hybrid-override-pattern is deprecated; use --hybrid-layer-pattern instead.")
    warning_rank_0("--hybrid-override-pattern is deprecated. Use --hybrid-layer-pattern instead.")
    return args.hybrid_override_pattern, "--hybrid-override-pattern"


def _layer_pattern(args) -> str:
    pattern, flag = _given_pattern(args)
    if pattern is not None:
        unknown = sorted(set(pattern) - set(SUPPORTED_SYMBOLS))
        require(not unknown,
                f"{flag} {pattern!r} has symbol(s) {unknown}; allowed: "
                f"{' '.join(SUPPORTED_SYMBOLS)} (M Mamba, * attention, - MLP, {MOE} MoE)")
        require(MOE not in pattern or args.num_experts is not None,
                f"{flag} {pattern!r} has MoE layers ({MOE}): set --num-experts")
        require(len(pattern) == args.num_layers,
                f"{flag} {pattern!r} has {len(pattern)} layers but "
                f"--num-layers is {args.num_layers} (make them equal)")
    require(args.hybrid_attention_ratio + args.hybrid_mlp_ratio <= 1.0,
            f"--hybrid-attention-ratio {args.hybrid_attention_ratio} + --hybrid-mlp-ratio "
            f"{args.hybrid_mlp_ratio} exceeds 1")
    from megatron.varlen.mamba import triton_stand_in

    triton_stand_in.install()
    from megatron.core.ssm.mamba_hybrid_layer_allocation import allocate_layers

    try:
        return "".join(allocate_layers(args.num_layers, args.hybrid_attention_ratio,
                                       args.hybrid_mlp_ratio, pattern))
    except ValueError as err:  # megatron-core: pattern counts disagree with the ratios
        require(False, f"{flag} {pattern!r}: {err}")


def _pattern_as_given(args) -> tuple[str | None, str]:
    """(pattern, flag) before validation resolves the two names (checked there)."""
    if args.hybrid_layer_pattern is not None:
        return args.hybrid_layer_pattern, "--hybrid-layer-pattern"
    return args.hybrid_override_pattern, "--hybrid-override-pattern"


def apply_pattern_stages(args) -> None:
    """Megatron-LM main: --num-layers is the pattern's layer count when omitted, and ``|`` in
    the pattern separates pipeline stages. megatron-core 0.16.1's hybrid stack places layers by
    --decoder-first/last-pipeline-num-layers (a first stage, a last stage, equal middle ones)
    and builds no virtual stages: ``|`` stages of that shape become those two flags, others
    are refused in one line. Runs before the GPT checks, which read both flags."""
    pattern, flag = _pattern_as_given(args)
    if pattern is None:
        require(args.num_layers is not None,
                "--num-layers is required (or give --hybrid-layer-pattern: its layer count)")
        return
    segments = pattern.split(PIPE)
    layers = sum(map(len, segments))
    if args.num_layers is None:
        args.num_layers = layers
    # Megatron-LM main warns and takes the pattern's count; a disagreement is refused here
    require(args.num_layers == layers, f"{flag} {pattern!r} has {layers} layers but --num-layers "
                                       f"is {args.num_layers} (make them equal, or omit "
                                       f"--num-layers)")
    if len(segments) > 1:
        _set_stage_sizes(args, f"{flag} {pattern!r}", [len(part) for part in segments])
    # The layers are the model (checkpoints record them); the stages live in the two flags,
    # so a resume may move the | as it may change those flags.
    for dest in ("hybrid_layer_pattern", "hybrid_override_pattern"):
        if getattr(args, dest) is not None:
            setattr(args, dest, getattr(args, dest).replace(PIPE, ""))


def _set_stage_sizes(args, named: str, sizes: list[int]) -> None:
    pp = args.pipeline_model_parallel_size
    require(args.decoder_first_pipeline_num_layers is None
            and args.decoder_last_pipeline_num_layers is None,
            f"{named} gives the pipeline stages with '{PIPE}': drop "
            f"--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers (as "
            f"Megatron-LM)")
    require(len(sizes) == pp,
            f"{named} has {len(sizes)} pipeline segments for --pipeline-model-parallel-size "
            f"{pp}: one per stage (more would be virtual pipeline stages, which megatron-core "
            f"0.16.1's hybrid stack does not build)")
    require(all(sizes), f"{named} leaves a pipeline stage without layers")
    middle = set(sizes[1:-1])
    require(len(middle) <= 1,
            f"{named} has stages of {sizes} layers: megatron-core 0.16.1's hybrid stack places "
            f"a first stage, a last stage and middle stages of one size; make the middle ones "
            f"equal")
    if len(set(sizes)) == 1:
        return  # the even split
    size_of_middle = middle.pop() if middle else None
    args.decoder_first_pipeline_num_layers = sizes[0] if sizes[0] != size_of_middle else None
    args.decoder_last_pipeline_num_layers = sizes[-1] if sizes[-1] != size_of_middle else None


def _mamba_heads(args) -> int:
    d_inner = MAMBA_EXPAND * args.hidden_size
    if args.mamba_num_heads is not None:
        return args.mamba_num_heads
    require(d_inner % args.mamba_head_dim == 0,
            f"2 x --hidden-size = {d_inner} is not divisible by --mamba-head-dim "
            f"{args.mamba_head_dim} (or set --mamba-num-heads)")
    return d_inner // args.mamba_head_dim


def _validate_mamba_split(args, heads: int) -> None:
    """Heads and groups split over TP, then over every possible CP group size."""
    tp, groups = args.tensor_model_parallel_size, args.mamba_num_groups
    require(heads % groups == 0,
            f"Mamba heads {heads} are not divisible by --mamba-num-groups {groups}")
    require(heads % tp == 0 and groups % tp == 0,
            f"Mamba heads {heads} and --mamba-num-groups {groups} must both be divisible by "
            f"--tensor-model-parallel-size {tp}")
    heads_tp, groups_tp = heads // tp, groups // tp
    for cp in possible_cp_sizes(args):
        where = (f"CP group size {cp} (sizes dynamic CP may pick: {possible_cp_sizes(args)})"
                 if args.dynamic_context_parallel else f"--context-parallel-size {cp}")
        require(heads_tp % cp == 0,
                f"Mamba heads {heads} / --tensor-model-parallel-size {tp} = {heads_tp} per TP "
                f"rank are not divisible by {where}; TP x CP must divide the heads (change "
                f"--mamba-num-heads/--mamba-head-dim or the parallel sizes)")
        require(groups_tp % cp == 0 or cp % groups_tp == 0,
                f"--mamba-num-groups {groups} / TP {tp} = {groups_tp} per TP rank and {where} "
                f"must divide one another")


def refuse_hugging_face_flags(args) -> None:
    """The hybrid family has no Hugging Face adapter (model_family.py): checked before the GPT
    flags, whose checks would read the checkpoint first."""
    for flag, value in (("--hf-checkpoint", args.hf_checkpoint), ("--save-hf", args.save_hf)):
        require(value is None, f"{flag}: hybrid Mamba models have no Hugging Face checkpoint "
                               f"format here (Llama/Qwen2/Qwen3 only, with pretrain_gpt.py)")


def validate_hybrid_args(args) -> None:
    """Checks the hybrid flags after the GPT ones; fills the derived hybrid fields."""
    require(args.pipeline_model_parallel_layout is None,
            "--pipeline-model-parallel-layout is for GPT models: megatron-core's hybrid stack "
            "splits its layer pattern by --decoder-first-pipeline-num-layers / "
            "--decoder-last-pipeline-num-layers (Megatron-LM refuses it with a hybrid pattern)")
    require(args.virtual_pipeline_model_parallel_size is None,
            "--num-layers-per-virtual-pipeline-stage / --num-virtual-stages-per-pipeline-rank: "
            "megatron-core's hybrid stack has no virtual pipeline stages")
    for flag, given in (("--account-for-embedding-in-pipeline-split",
                         args.account_for_embedding_in_pipeline_split),
                        ("--account-for-loss-in-pipeline-split",
                         args.account_for_loss_in_pipeline_split)):
        # megatron-core's hybrid stack splits its pattern without them (Megatron-LM refuses
        # them with a hybrid pattern); uneven first/last stages it does split.
        require(not given, f"{flag}: megatron-core's hybrid stack does not count the embedding "
                           f"or loss as a layer; use --decoder-first-pipeline-num-layers / "
                           f"--decoder-last-pipeline-num-layers")
    require(not args.mtp_num_layers, "--mtp-num-layers is not supported by pretrain_mamba.py")
    # The hybrid stack's attention layers are megatron-core's standard self-attention here.
    require(not args.multi_latent_attention,
            "--multi-latent-attention is not supported by pretrain_mamba.py: its attention "
            "layers are standard self-attention (MLA: pretrain_gpt.py)")
    validate_hybrid_census_flags(args, require)
    pattern = _layer_pattern(args)
    heads = _mamba_heads(args)
    if MAMBA in pattern:
        _validate_mamba_split(args, heads)
        # A dense mask keeps attention inside documents, but Mamba's scan would still carry
        # state across them; packed, every document is a sequence of its own for both.
        require(not (args.reset_attention_mask and not args.sequence_packing),
                "--reset-attention-mask without --sequence-packing: Mamba layers would still "
                "carry state across the documents of a sample; pack them (--sequence-packing)")
    refuse_modules_without_layers(args, require, pattern, "--hybrid-override-pattern "
                                  f"{pattern!r}")
    args.hybrid_layer_pattern = pattern
    args.mamba_num_heads_resolved = heads
    flag_ranges.validate_memory(args, require, hybrid_stack_parameters(args))


def mamba_layer_parameters(hidden: int, heads: int, head_dim: int, groups: int,
                           state_dim: int) -> int:
    """Weights of one Mamba-2 mixer: the input projection (x and z of d_inner channels, B and C
    of groups x state, dt per head) and the output projection."""
    d_inner = heads * head_dim
    return hidden * (2 * d_inner + 2 * groups * state_dim + heads) + d_inner * hidden


def moe_layer_parameters(args) -> int:
    """Weights one rank holds of an MoE layer (its experts split over expert parallelism),
    counted like the layers' (whole before TP); 0 without --num-experts."""
    if args.num_experts is None:
        return 0
    expert = flag_ranges.mlp_parameters(args.hidden_size,
                                        args.moe_ffn_hidden_size or args.ffn_hidden_size,
                                        flag_ranges.gated_mlp(args))
    shared = (flag_ranges.mlp_parameters(args.hidden_size,
                                         args.moe_shared_expert_intermediate_size,
                                         flag_ranges.gated_mlp(args))
              if args.moe_shared_expert_intermediate_size else 0)
    return args.num_experts // args.expert_model_parallel_size * expert + shared


def hybrid_stack_parameters(args) -> int:
    """Weights of the whole hybrid stack, layer by layer of the resolved pattern."""
    kv_channels = args.kv_channels or args.hidden_size // args.num_attention_heads
    per_layer = {
        MAMBA: mamba_layer_parameters(args.hidden_size, args.mamba_num_heads_resolved,
                                      args.mamba_head_dim, args.mamba_num_groups,
                                      args.mamba_state_dim),
        ATTENTION: flag_ranges.attention_parameters(args.hidden_size, args.num_attention_heads,
                                                    args.num_query_groups, kv_channels),
        MLP: flag_ranges.mlp_parameters(args.hidden_size, args.ffn_hidden_size,
                                        flag_ranges.gated_mlp(args)),
        MOE: moe_layer_parameters(args),
    }
    return sum(per_layer[symbol] for symbol in args.hybrid_layer_pattern)


def _check_spec(args) -> None:
    """--spec may only name megatron-core's stock hybrid stack, which is the default here;
    cleared before GPT's validation, which would load it as a GPT layer spec."""
    require(args.spec is None or tuple(args.spec) in MEGATRON_CORE_HYBRID_STACK_SPECS,
            f"--spec {' '.join(args.spec or ())}: pretrain_mamba.py builds its own hybrid stack "
            f"spec (megatron-core's stock stack, {' '.join(MEGATRON_CORE_HYBRID_STACK_SPECS[0])}, "
            f"in varlen form); drop the flag")
    args.spec = None  # the stock stack named is the default one


def parse_hybrid_args(argv: list[str] | None = None, world_size: int | None = None):
    """Parses and validates; raises ArgumentValidationError with a one-line message."""
    parser = build_hybrid_parser()
    # --use-checkpoint-args: the loaded checkpoint's model flags (checkpoint_model_flags.py)
    taken = checkpoint_model_flags.read_checkpoint_flags(list(sys.argv[1:] if argv is None
                                                              else argv))
    checkpoint_model_flags.apply_as_defaults(parser, taken)
    args = parser.parse_args(argv)
    checkpoint_model_flags.override_command_line(args, taken)
    args.world_size = world_size
    refuse_hugging_face_flags(args)
    _check_spec(args)
    apply_pattern_stages(args)  # --num-layers and the stage sizes the GPT checks read
    args = validate_args(args, check_memory=False)  # checked below, for the hybrid stack
    validate_hybrid_args(args)
    return args


def parse_hybrid_args_or_exit(argv: list[str] | None = None) -> argparse.Namespace:
    """For pretrain_mamba.py: a user error prints one line and exits with code 2."""
    with exit_on_flag_errors(PROG):
        return parse_hybrid_args(argv)
