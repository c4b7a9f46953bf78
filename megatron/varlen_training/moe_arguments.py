"""Megatron-LM's Mixture-of-Experts flags (same names and meanings) and their start-up checks.

The MoE layer is megatron-core's ``MoELayer`` with plain-torch experts; see docs/MOE.md for what
each flag does under packing and dynamic CP.
"""

from __future__ import annotations

import argparse
import ast
import functools

from megatron.varlen.model import moe_layer_pattern
from megatron.varlen_training.config.moe import DEFAULT_BIAS_UPDATE_RATE, DEFAULT_DROP_POLICY
from megatron.varlen_training.flag_ranges import layer_pattern_problem
from megatron.varlen_training.refused_choices import megatron_lm_choices, refused_help

LOAD_BALANCING_TYPES = ("aux_loss", "seq_aux_loss", "global_aux_loss", "none")
DISPATCHERS = ("alltoall", "allgather")
ALLTOALL, ALLGATHER = DISPATCHERS
SCORE_FUNCTIONS = ("softmax", "sigmoid")
ROUTER_DTYPES = ("fp32", "fp64")
GROUP_TITLE = "mixture of experts"
# The flags that mean nothing without --num-experts (refused then, unless left at default).
MOE_DESTS = frozenset({
    "moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
    "moe_layer_freq", "expert_model_parallel_size", "expert_tensor_parallel_size",
    "moe_router_load_balancing_type", "moe_aux_loss_coeff", "moe_z_loss_coeff",
    "moe_router_score_function", "moe_router_pre_softmax", "moe_router_topk_scaling_factor",
    "moe_token_dispatcher_type", "moe_router_dtype", "moe_expert_capacity_factor",
    "moe_router_enable_expert_bias", "moe_router_bias_update_rate", "moe_router_num_groups",
    "moe_router_group_topk", "moe_shared_expert_overlap", "moe_token_drop_policy",
    "moe_pad_expert_input_to_capacity"})
DROP_POLICIES = (DEFAULT_DROP_POLICY, "position")
MAX_PATTERN_LENGTH = 100_000  # a --moe-layer-freq pattern longer than any model's layer count


def flag_name(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def parse_layer_freq(text, flag: str):
    """``--moe-layer-freq``: an int N (every N-th layer, from the first, is MoE), a Python list
    of 0/1 per layer, e.g. ``[1,0,1,0]``, or Megatron-LM's pattern expression of such lists,
    ``+`` and ``* int``, e.g. ``([0]*1+[1]*3)`` (first layer dense). Evaluated by walking the
    syntax tree: nothing but those lists, sums and repetitions is accepted. Megatron-LM parses
    ``--window-attn-skip-freq`` and ``--no-rope-freq`` the same way; ``flag`` is the one errors
    name. A config tree (megatron.wrap) may give the int or the list itself."""
    if isinstance(text, (int, list, tuple)) and not isinstance(text, bool):
        value = list(text) if isinstance(text, tuple) else text
    else:
        try:
            value = _layer_pattern(ast.parse(str(text).strip(), mode="eval").body)
        except (ValueError, SyntaxError):
            value = None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, list) and value and all(
            type(entry) is int and entry in (0, 1) for entry in value):
        return list(value)
    raise ValueError(f"{flag} {text!r}: give an int >= 1, a list of 0/1 per layer or a "
                     f"pattern such as ([0]*1+[1]*3)")


def _layer_pattern(node: ast.AST):
    """The int or list a ``--moe-layer-freq`` expression denotes (ValueError for any other)."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.List):
        return [_layer_pattern(item) for item in node.elts]
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        left, right = _layer_pattern(node.left), _layer_pattern(node.right)
        if isinstance(node.op, ast.Add) and isinstance(left, list) and isinstance(right, list):
            return left + right
        if isinstance(node.op, ast.Mult) and isinstance(left, list) and type(right) is int \
                and 0 <= right and len(left) * right <= MAX_PATTERN_LENGTH:
            return left * right
    raise ValueError("not a layer pattern")


def add_moe_args(parser) -> None:
    """Registers Megatron-LM's MoE flags on ``parser``."""
    group = parser.add_argument_group(GROUP_TITLE)
    group.add_argument("--num-experts", type=int, default=None,
                       help="Experts per MoE layer (None: dense MLP layers).")
    group.add_argument("--moe-router-topk", type=int, default=2,
                       help="Experts each token is routed to.")
    group.add_argument("--moe-ffn-hidden-size", type=int, default=None,
                       help="Hidden size of each routed expert (default --ffn-hidden-size).")
    group.add_argument("--moe-shared-expert-intermediate-size", type=int, default=None,
                       help="Hidden size of the shared expert every token also goes through "
                            "(None: no shared expert).")
    group.add_argument("--moe-layer-freq", type=layer_freq_type("--moe-layer-freq"), default=1,
                       help="Which layers are MoE: every N-th (an int), a 0/1 list per layer or a "
                            "pattern such as ([0]*1+[1]*3) (the first layer dense).")
    group.add_argument("--expert-model-parallel-size", type=int, default=1,
                       help="Expert parallelism: the experts are split over this many ranks.")
    group.add_argument("--expert-tensor-parallel-size", type=int, default=None,
                       help="TP size inside each expert (default --tensor-model-parallel-size).")
    group.add_argument("--moe-router-load-balancing-type", default="aux_loss",
                       choices=megatron_lm_choices("--moe-router-load-balancing-type",
                                                   LOAD_BALANCING_TYPES),
                       help="aux_loss: per micro-batch; seq_aux_loss: per real sequence; "
                            "global_aux_loss: over the whole TP x DP x CP domain; none."
                            + refused_help("--moe-router-load-balancing-type"))
    group.add_argument("--moe-aux-loss-coeff", type=float, default=0.0,
                       help="Weight of the load-balancing loss (0: off).")
    group.add_argument("--moe-z-loss-coeff", type=float, default=None,
                       help="Weight of the router z-loss (None: off).")
    group.add_argument("--moe-router-score-function", default="softmax",
                       choices=megatron_lm_choices("--moe-router-score-function",
                                                   SCORE_FUNCTIONS),
                       help="Router score function."
                            + refused_help("--moe-router-score-function"))
    group.add_argument("--moe-router-pre-softmax", action="store_true",
                       help="Softmax before the top-k (needed for top-1 with softmax).")
    group.add_argument("--moe-router-topk-scaling-factor", type=float, default=None,
                       help="Multiplies the top-k routing weights.")
    group.add_argument("--moe-token-dispatcher-type", default=None,
                       choices=megatron_lm_choices("--moe-token-dispatcher-type", DISPATCHERS),
                       help="How tokens reach their experts' ranks. Default: alltoall with "
                            "--sequence-packing (allgather needs equal token counts on every "
                            "rank), else allgather (Megatron-LM's default)."
                            + refused_help("--moe-token-dispatcher-type"))
    group.add_argument("--moe-router-dtype", default=None, choices=ROUTER_DTYPES,
                       help="Router computation dtype (None: the model's).")
    group.add_argument("--moe-expert-capacity-factor", type=float, default=None,
                       help="Expert capacity (tokens dropped beyond it); not with "
                            "--sequence-packing, tensor or context parallelism.")
    group.add_argument("--moe-token-drop-policy", default=DEFAULT_DROP_POLICY,
                       choices=DROP_POLICIES,
                       help="With a capacity: drop the tokens of lowest routing probability "
                            "(probs) or the last ones of the micro-batch (position).")
    group.add_argument("--moe-pad-expert-input-to-capacity", action="store_true",
                       help="With a capacity: pad every expert's input to exactly the capacity.")
    _add_router_options(group)


def _add_router_options(group) -> None:
    """Aux-loss-free balancing (DeepSeek-V3's expert bias) and group-limited routing."""
    group.add_argument("--moe-router-enable-expert-bias", action="store_true",
                       help="A per-expert bias added to the scores for the top-k choice only, "
                            "moved after every step towards balance (sigmoid scores).")
    group.add_argument("--moe-router-bias-update-rate", type=float,
                       default=DEFAULT_BIAS_UPDATE_RATE,
                       help="How far each step moves an expert's bias: towards the experts "
                            "that got fewer than the average tokens of the step.")
    group.add_argument("--moe-router-num-groups", type=int, default=None,
                       help="Group-limited routing: the experts split into this many groups "
                            "(e.g. the EP size: device-limited routing).")
    group.add_argument("--moe-router-group-topk", type=int, default=None,
                       help="Group-limited routing: the groups each token may choose its "
                            "experts from.")
    group.add_argument("--moe-shared-expert-overlap", action="store_true",
                       help="Run the shared expert beside the token dispatcher's communication "
                            "(a side stream; speed only; the alltoall dispatcher).")


def layer_freq_type(flag: str):
    """The argparse ``type`` of a per-layer pattern flag (--moe-layer-freq,
    --window-attn-skip-freq, --no-rope-freq): :func:`parse_layer_freq` naming ``flag``."""
    def parse(text):
        try:
            return parse_layer_freq(text, flag)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from err
    return parse


def _check_sizes(args, require) -> None:
    experts, ep = args.num_experts, args.expert_model_parallel_size
    require(1 <= args.moe_router_topk <= experts,
            f"--moe-router-topk {args.moe_router_topk} must be in [1, --num-experts {experts}]")
    require(experts % ep == 0, f"--num-experts {experts} is not divisible by "
                               f"--expert-model-parallel-size {ep}")
    etp = args.expert_tensor_parallel_size
    per_stage = args.world_size // args.pipeline_model_parallel_size
    require(per_stage % (ep * etp) == 0,
            f"--expert-model-parallel-size {ep} x --expert-tensor-parallel-size {etp} = "
            f"{ep * etp} does not divide the {per_stage} ranks of a pipeline stage (change "
            f"--expert-model-parallel-size)")
    tp = args.tensor_model_parallel_size
    # megatron-core 0.16.1 marks expert weights as expert-parallel (reduced over the expert
    # data-parallel group) only with EP > 1; with EP 1 they are reduced as dense weights, which
    # is wrong once they are split over another TP size (measured: other gradients than ETP=TP).
    require(ep > 1 or etp == tp,
            f"--expert-tensor-parallel-size {etp} differs from --tensor-model-parallel-size "
            f"{tp} with --expert-model-parallel-size 1: megatron-core then reduces the experts' "
            f"gradients as dense weights, which is wrong for their split; set "
            f"--expert-model-parallel-size > 1 or --expert-tensor-parallel-size {tp}")
    require(args.disable_bias_linear,
            "MoE layers need --disable-bias-linear (megatron-core 0.16.1's plain-torch experts "
            "fail on linear biases: an in-place add on a tensor-parallel view)")
    require(args.tensor_model_parallel_size == 1 or args.sequence_parallel,
            f"MoE with --tensor-model-parallel-size {args.tensor_model_parallel_size} needs "
            f"--sequence-parallel (megatron-core's MoE layer refuses TP without it)")
    freq = args.moe_layer_freq
    problem = layer_pattern_problem("--moe-layer-freq", freq, args.num_layers)
    require(problem is None, problem)
    require(isinstance(freq, list) or freq >= 1, f"--moe-layer-freq {freq} must be >= 1")


def _check_routing(args, require) -> None:
    packing = args.sequence_packing
    require(not packing or args.moe_token_dispatcher_type == ALLTOALL,
            f"--moe-token-dispatcher-type {args.moe_token_dispatcher_type} gathers every "
            f"rank's tokens over TP x EP, which needs the same token count on every rank; "
            f"packed micro-batches differ per rank (use alltoall with --sequence-packing)")
    require(not packing or args.moe_expert_capacity_factor is None,
            f"--moe-expert-capacity-factor {args.moe_expert_capacity_factor} drops tokens by a "
            f"capacity computed from the micro-batch's token count, which packing changes (the "
            f"trained model would depend on the packing): drop the flag with --sequence-packing")
    # megatron-core sizes the capacity from the tokens each rank routes: sequence parallelism
    # and CP give a rank only its share of the micro-batch, so the drops depend on the layout
    # (probed: TP2 + SP 2.2e-3 and CP2 1.4e-3 off the single rank by iteration 2).
    shares = args.tensor_model_parallel_size * args.context_parallel_size
    require(args.moe_expert_capacity_factor is None or shares == 1,
            f"--moe-expert-capacity-factor {args.moe_expert_capacity_factor} drops tokens by a "
            f"capacity computed from each rank's share of the micro-batch, which "
            f"--tensor-model-parallel-size {args.tensor_model_parallel_size} (sequence "
            f"parallel) x --context-parallel-size {args.context_parallel_size} = {shares} "
            f"splits (the trained model would depend on the layout): drop the flag or use "
            f"tensor and context parallel sizes of 1")
    capacity_only = {"--moe-token-drop-policy": args.moe_token_drop_policy != DEFAULT_DROP_POLICY,
                     "--moe-pad-expert-input-to-capacity": args.moe_pad_expert_input_to_capacity}
    for flag, given in capacity_only.items():
        require(not given or args.moe_expert_capacity_factor is not None,
                f"{flag} applies to dropped tokens only: it needs --moe-expert-capacity-factor")
    _check_mtp_routers(args, require)
    require(args.moe_router_topk > 1 or args.moe_router_score_function != "softmax"
            or args.moe_router_pre_softmax,
            "--moe-router-topk 1 with softmax scores needs --moe-router-pre-softmax (a softmax "
            "over one selected expert has zero gradient)")


def _check_mtp_routers(args, require) -> None:
    """MTP layers with MoE MLPs route a mask in which each sample's last ``depth`` positions
    are padding (their rolled input is no token of the sample); unpacked CP splits the sample
    first, so that mask cannot be built there. Dense MTP layers (the last decoder layer dense
    in ``--moe-layer-freq``: Megatron-LM builds MTP layers like it) have no router to mask."""
    if args.sequence_packing or not args.mtp_num_layers or args.context_parallel_size == 1:
        return
    freq = args.moe_layer_freq
    require(not moe_layer_pattern(freq, args.num_layers)[-1],
            f"MoE with --mtp-num-layers {args.mtp_num_layers} and --context-parallel-size "
            f"{args.context_parallel_size} needs --sequence-packing when the MTP layers are MoE, "
            f"as here (they are built like the last decoder layer, which --moe-layer-freq "
            f"{moe_layer_freq_text(freq)} makes MoE): unpacked CP splits each sample before the "
            f"MTP layers' routers could drop its last positions; add --sequence-packing or make "
            f"the last decoder layer dense (a --moe-layer-freq list ending in 0)")


def moe_layer_freq_text(freq) -> str:
    """``--moe-layer-freq`` as given: an int, or the 0/1 list without spaces."""
    return str(freq).replace(" ", "") if isinstance(freq, list) else str(freq)


def _check_router_options(args, require) -> None:
    """Expert bias, group-limited routing and the shared expert's overlap: megatron-core's
    conditions, in one line each."""
    require(not args.moe_router_enable_expert_bias
            or args.moe_router_score_function == "sigmoid",
            f"--moe-router-enable-expert-bias needs --moe-router-score-function sigmoid "
            f"(megatron-core's expert bias; got {args.moe_router_score_function})")
    if args.moe_shared_expert_overlap:
        require(args.moe_shared_expert_intermediate_size is not None,
                "--moe-shared-expert-overlap needs a shared expert "
                "(--moe-shared-expert-intermediate-size)")
        require(args.moe_token_dispatcher_type == ALLTOALL,
                f"--moe-shared-expert-overlap works with --moe-token-dispatcher-type alltoall "
                f"only (megatron-core's; got {args.moe_token_dispatcher_type})")
    groups, group_topk = args.moe_router_num_groups, args.moe_router_group_topk
    require((groups is None) == (group_topk is None),
            f"--moe-router-num-groups {groups} and --moe-router-group-topk {group_topk}: "
            f"give both (group-limited routing) or neither")
    if groups is None:
        return
    experts, topk = args.num_experts, args.moe_router_topk
    require(experts % groups == 0, f"--num-experts {experts} is not divisible by "
                                   f"--moe-router-num-groups {groups}")
    require(group_topk <= groups, f"--moe-router-group-topk {group_topk} exceeds "
                                  f"--moe-router-num-groups {groups}")
    # megatron-core scores each group by the sum of its top (topk / group_topk) experts and
    # then picks the top-k among the chosen groups' experts: both must exist.
    require(topk % group_topk == 0 and topk // group_topk <= experts // groups,
            f"--moe-router-topk {topk} must be a multiple of --moe-router-group-topk "
            f"{group_topk} and at most {group_topk} x {experts // groups} (the experts of the "
            f"chosen groups)")


def _check_no_moe_flags(args, parser_defaults: dict, require) -> None:
    """Without --num-experts the model is dense: an MoE flag given anyway would be silently
    ignored, so it is refused instead."""
    for dest, default in parser_defaults.items():
        value = getattr(args, dest)
        require(value == default, f"{flag_name(dest)} {value} needs --num-experts (the model "
                                  f"has no MoE layers without it)")


@functools.cache
def _moe_defaults() -> dict:
    """dest -> parser default of every flag in :data:`MOE_DESTS`."""
    parser = argparse.ArgumentParser(add_help=False)
    add_moe_args(parser)
    defaults = vars(parser.parse_args([]))
    return {dest: defaults[dest] for dest in MOE_DESTS}


def default_dispatcher(sequence_packing: bool) -> str:
    """``--moe-token-dispatcher-type`` left unset: alltoall with packing (allgather needs equal
    token counts on every rank), else Megatron-LM's default, allgather."""
    return ALLTOALL if sequence_packing else ALLGATHER


def validate_moe_args(args, require) -> None:
    """Resolves the MoE defaults and refuses what cannot run, in one line each."""
    if args.num_experts is None:
        _check_no_moe_flags(args, _moe_defaults(), require)
    if args.moe_token_dispatcher_type is None:
        args.moe_token_dispatcher_type = default_dispatcher(args.sequence_packing)
    if args.expert_tensor_parallel_size is None:
        args.expert_tensor_parallel_size = args.tensor_model_parallel_size
    if args.num_experts is None:
        return
    _check_sizes(args, require)
    _check_routing(args, require)
    _check_router_options(args, require)
