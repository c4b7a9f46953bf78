"""This fork's own flags (sequence packing, SFT data): one small group, mapped 1:1 to fields.

Kept apart from :mod:`megatron.varlen_training.arguments` so that every flag the fork adds to
Megatron-LM's CLI is visible in one place.
"""

from __future__ import annotations


import torch

from megatron.varlen_training.log import warning_rank_0
from megatron.varlen_training.thd_shape_arguments import (
    add_thd_shape_args, validate_cp_comm_type, validate_thd_shape_args,
)
from megatron.varlen.packing import parse_length_config
from megatron.varlen.platform import ATTENTION_BACKENDS, AUTO, resolve_attention_backend
from megatron.varlen.scheduling import (
    DP_BALANCED, DYNAMIC_CP, PROFILES, build_group_layout, canonical_name,
    padded_length, resolve_hardware_profile, scheduler_help, scheduler_names,
)
from megatron.varlen.model import check_takes_thd, load_layer_spec


DEFAULT_PROFILE = "h100_nvlink"


def add_varlen_args(parser) -> None:
    """Registers the fork's flags on ``parser``."""
    group = parser.add_argument_group("variable-length data (this fork)")
    group.add_argument("--sequence-packing", action="store_true",
                       help="Pack variable-length samples into THD micro-batches balanced across "
                            "DP x CP ranks (implies per-token loss).")
    group.add_argument("--sequence-packing-scheduler", default=None,
                       choices=scheduler_names(), help=scheduler_help())
    group.add_argument("--dynamic-context-parallel", action="store_true",
                       help="Give every sequence its own CP group size, micro-batch by "
                            "micro-batch, across all DP x CP ranks (implies --sequence-packing).")
    group.add_argument("--hybrid-context-parallel", action="store_true",
                       help="Deprecated alias of --dynamic-context-parallel.")
    group.add_argument("--min-dynamic-context-parallel-size", type=int, default=1,
                       help="Smallest CP group a sequence may get under dynamic CP.")
    group.add_argument("--max-seqlen-per-dp-cp-rank", type=int, default=None,
                       help="Token budget of one DP x CP rank in one packed micro-batch. "
                            "Default: --seq-length / --context-parallel-size, rounded up to "
                            "the CP/SP divisor.")
    group.add_argument("--hardware-profile", default=DEFAULT_PROFILE, metavar="NAME|PATH",
                       help=f"Rates the packing scheduler's cost model is built from: "
                            f"{', '.join(sorted(PROFILES))} (analytic), or a JSON profile "
                            f"measured on your GPU by tools/measure_cost_model.py.")
    group.add_argument("--validate-packing-schedules", action="store_true",
                       help="Debug: check every step's packing schedule against all of its "
                            "invariants (each sequence once, budgets, CP groups of the layout) "
                            "before it runs; an invalid one stops the run naming the broken "
                            "invariant. Costs a few ms per step.")
    group.add_argument("--spec", nargs=2, default=None, metavar=("MODULE", "FUNCTION"),
                       help="Layer spec function to build the decoder with (Megatron's flag); "
                            "default megatron.varlen.model.spec get_varlen_gpt_layer_spec.")
    group.add_argument("--attention-backend", default=AUTO, choices=ATTENTION_BACKENDS,
                       help="Core attention (Megatron-LM's flag): local = plain-torch reference; "
                            "flash = torch's FlashAttention varlen kernel (CUDA, bf16/fp16, no "
                            "attention dropout; on CPU its plain-torch twin); te = Transformer "
                            "Engine (Megatron-LM's fused / unfused: te held to TE's cuDNN or "
                            "unfused kernel); auto = te if it imports, else flash on CUDA for "
                            "bf16/fp16 without attention dropout, else local.")
    group.add_argument("--sft", action="store_true",
                       help="Supervised fine-tuning data: one variable-length sample per sequence "
                            "(--mock-data --sft gives the mock SFT dataset).")
    group.add_argument("--sft-mock-dataset-config-json", default=None,
                       help="Lengths of the mock SFT dataset: inline JSON or a path to a JSON "
                            "file, e.g. '{\"mode\":\"file\",\"path\":\"lengths.csv\"}'.")
    add_thd_shape_args(parser)


def possible_cp_sizes(args) -> list[int]:
    """Every CP group size a micro-batch can run on (static, or the dynamic layout's sizes)."""
    return sequence_cp_sizes(args.data_parallel_size * args.context_parallel_size,
                             args.context_parallel_size, args.min_dynamic_context_parallel_size,
                             args.dynamic_context_parallel)


def sequence_cp_sizes(num_ranks: int, cp_size: int, min_cp_size: int,
                      dynamic: bool) -> list[int]:
    """Every CP group size a sequence may run on, ascending: ``cp_size`` alone for static CP,
    else the sizes of the dynamic layout over ``num_ranks`` = DP x CP ranks (from the smallest
    chain size >= ``min_cp_size``: :func:`build_group_layout`). From plain values, for the
    flags (:func:`possible_cp_sizes`) and a ``RunConfig`` alike."""
    if not dynamic:
        return [cp_size]
    return sorted(build_group_layout(num_ranks, min_cp_size, cp_size).sequence_sizes)


def sp_factor(args) -> int:
    """What sequence parallelism multiplies the padding divisor by (TP, or 1 without)."""
    return args.tensor_model_parallel_size if args.sequence_parallel else 1


def precision_dtype(bf16: bool, fp16: bool) -> torch.dtype:
    """The parameters' dtype of ``--bf16``/``--fp16`` (float32 without either)."""
    return torch.bfloat16 if bf16 else torch.float16 if fp16 else torch.float32


def attention_backend(args) -> str:
    """The core attention the flags ask for: --attention-backend resolved for their dtype,
    dropout and softmax (model.py resolves the run's the same way).

    Raises:
        ValueError: one line, when the requested backend cannot run this configuration.
    """
    return resolve_attention_backend(args.attention_backend,
                                     precision_dtype(args.bf16, args.fp16), args.attention_dropout,
                                     args.softmax_type)


def validate_varlen_args(args, require) -> None:
    """Checks the fork's flags; ``require(cond, message)`` raises the one-line error."""
    try:
        validate_cp_comm_type(args, require, attention_backend(args))
    except ValueError as err:
        require(False, str(err))
    try:  # a profile file is read (and refused in one line) at start-up
        resolve_hardware_profile(args.hardware_profile)
    except ValueError as err:
        require(False, str(err))
    require(args.sft_mock_dataset_config_json is None or (args.sft and args.mock_data),
            "--sft-mock-dataset-config-json shapes the lengths of --mock-data --sft samples: "
            "it needs both flags (real --sft data has its own lengths)")
    if args.sft_mock_dataset_config_json is not None:
        try:  # fail at start-up, in one line, not inside the first data read
            parse_length_config(args.sft_mock_dataset_config_json, args.seq_length)
        except ValueError as err:
            require(False, str(err))
    _resolve_dynamic_context_parallel(args, require)
    # Packs vary in length; with VPP they are padded to the budget instead (fixed p2p shapes,
    # see PackingConfig.fixed_tokens_per_rank).
    args.variable_seq_lengths = bool(args.sequence_packing
                                     and not args.virtual_pipeline_model_parallel_size)
    if not args.sequence_packing:
        require(args.max_seqlen_per_dp_cp_rank is None,
                "--max-seqlen-per-dp-cp-rank needs --sequence-packing")
    else:
        _validate_packing(args, require)
    validate_thd_shape_args(args, require, possible_cp_sizes(args), attention_backend(args))


def _resolve_dynamic_context_parallel(args, require) -> None:
    """One resolved field: the deprecated alias is folded in here and then removed."""
    if args.hybrid_context_parallel:
        warning_rank_0("--hybrid-context-parallel is deprecated; use --dynamic-context-parallel")
        args.dynamic_context_parallel = True
    del args.hybrid_context_parallel
    if not args.dynamic_context_parallel:
        require(args.sequence_packing_scheduler != DYNAMIC_CP,
                "--sequence-packing-scheduler default_dynamic_cp needs --dynamic-context-parallel")
        require(args.min_dynamic_context_parallel_size == 1,
                "--min-dynamic-context-parallel-size needs --dynamic-context-parallel")
        return
    require(args.max_seqlen_per_dp_cp_rank is not None,
            "--dynamic-context-parallel requires --max-seqlen-per-dp-cp-rank (the per-rank "
            "token budget that sizes each sequence's CP group)")
    require(args.sequence_packing_scheduler in (None, DYNAMIC_CP),
            f"--dynamic-context-parallel uses the default_dynamic_cp scheduler, not "
            f"--sequence-packing-scheduler {args.sequence_packing_scheduler}")
    dp_cp = args.data_parallel_size * args.context_parallel_size
    require(1 <= args.min_dynamic_context_parallel_size <= dp_cp,
            f"--min-dynamic-context-parallel-size {args.min_dynamic_context_parallel_size} "
            f"must be between 1 and DP x CP = {dp_cp}")
    args.sequence_packing = True
    args.sequence_packing_scheduler = DYNAMIC_CP


def _validate_capacity(args, require) -> None:
    """Samples are at most --seq-length tokens: the largest CP group must be able to hold one,
    padded as its group needs (2 x CP chunks, x TP with sequence parallel)."""
    if args.dynamic_context_parallel:
        ranks, what = args.data_parallel_size * args.context_parallel_size, "DP x CP"
    else:
        ranks, what = args.context_parallel_size, "CP"
    per_rank = padded_length(args.seq_length, ranks, sp_factor(args)) // ranks
    require(per_rank <= args.max_seqlen_per_dp_cp_rank,
            f"--seq-length {args.seq_length} (padded for {what} = {ranks} ranks: {per_rank} "
            f"tokens per rank) exceeds --max-seqlen-per-dp-cp-rank "
            f"{args.max_seqlen_per_dp_cp_rank} (raise --max-seqlen-per-dp-cp-rank"
            f"{'' if args.dynamic_context_parallel else ' or --context-parallel-size'})")


def _default_budget(args) -> int:
    per_rank = -(-args.seq_length // args.context_parallel_size)
    return padded_length(per_rank, args.context_parallel_size, sp_factor(args))


def _validate_packing(args, require) -> None:
    require(args.micro_batch_size == 1,
            f"--sequence-packing builds each micro-batch as one pack of up to "
            f"--max-seqlen-per-dp-cp-rank tokens per rank: --micro-batch-size must be 1 "
            f"(got {args.micro_batch_size})")
    args.sequence_packing_scheduler = canonical_name(args.sequence_packing_scheduler
                                                     or DP_BALANCED)
    if args.max_seqlen_per_dp_cp_rank is None:
        args.max_seqlen_per_dp_cp_rank = _default_budget(args)
    _validate_capacity(args, require)
    multiple = 2 * sp_factor(args)
    if args.virtual_pipeline_model_parallel_size:
        require(args.max_seqlen_per_dp_cp_rank % multiple == 0,
                f"with virtual pipeline stages every pack is padded to "
                f"--max-seqlen-per-dp-cp-rank tokens per rank, which must then be a multiple of "
                f"{multiple} (got {args.max_seqlen_per_dp_cp_rank})")
    # Only the global per-token mean is invariant to packing: a per-micro-batch mean weighs
    # tokens by how the samples happened to be packed.
    args.calculate_per_token_loss = True
    try:
        check_takes_thd(load_layer_spec(args.spec, args.normalization, attention_backend(args)),
                        args.spec)
    except ValueError as err:
        require(False, str(err))
