"""Megatron-compatible command line: flag names as in Megatron-LM for everything supported.

``parse_args(argv)`` parses and validates; every user error leaves as one line
(``pretrain_gpt.py: error: ...``) naming the flag, the value and the limit, with exit code 2.
The flag set is pinned by tests/unit_tests/varlen_training/test_arguments.py: a new flag is a
reviewed diff there. Groups mirror Megatron-LM's ``_add_*_args`` functions; the packing and
dynamic-CP flags of this fork live in :mod:`megatron.varlen_training.varlen_arguments`.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import sys
from collections.abc import Mapping
from typing import Any

from megatron.varlen_training import (
    attention_window_arguments, checkpoint_arguments, checkpoint_model_flags,
    checkpoint_save_arguments, data_arguments,
    dataloader_arguments, ddp_arguments, document_arguments, flag_ranges, kernel_arguments,
    logging_arguments, loss_scale_arguments, mla_arguments, model_arguments, moe_arguments,
    optimizer_arguments,
    pipeline_arguments, recipe_arguments, recompute_arguments, reliability_arguments,
    run_description, runtime_arguments, schedule_arguments, sft_arguments, tokenizer_arguments,
    training_loop_arguments, validation_arguments, varlen_arguments,
)
# Every other Megatron-LM flag: registered (census) or named with its workload (out of scope).
from megatron.varlen_training import megatron_lm_census_flags, out_of_scope_flags
from megatron.varlen_training.log import warning_rank_0
from megatron.varlen_training.process_group import report_start_up_error
from megatron.varlen_training.flag_errors import ArgumentValidationError, require  # noqa: F401
from megatron.varlen_training.refused_choices import (
    megatron_lm_choices, refused_help, validate_refused_choices,
)
from megatron.varlen_training.hf import arguments as hf_arguments
from megatron.varlen_training.tokenizer import TOKENIZER_TYPE_CHOICES
from megatron.varlen.scheduling import pad_multiple

ERROR_EXIT_CODE = 2
POSITION_EMBEDDING_TYPES = ("learned_absolute", "rope", "none")  # the ones built here
# --group-query-attention without --num-query-groups: Megatron-LM's default of the latter.
MEGATRON_LM_NUM_QUERY_GROUPS = 1
# Megatron-LM's warning when --sequence-parallel meets one tensor-parallel rank.
SEQUENCE_PARALLEL_OFF = (
    "Disabling sequence parallelism because tensor model parallelism is disabled")


class MegatronArgumentParser(argparse.ArgumentParser):
    """argparse with Megatron's flag style and a one-line error instead of usage + error.

    ``flag_actions`` lists every flag's action in the order added, its own or its argument
    groups' (argparse keeps them private): what reads the flag set (the facade's config path,
    the flag reference, ``--hf-checkpoint``'s defaults) reads it here.
    """

    def __init__(self, *args, **kwargs):
        self.flag_actions: list[argparse.Action] = []  # before __init__, which adds --help
        super().__init__(*args, **kwargs)

    def add_argument(self, *args, **kwargs) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        self.flag_actions.append(action)
        return action

    def add_argument_group(self, *args, **kwargs):
        group = super().add_argument_group(*args, **kwargs)
        add_to_group = group.add_argument

        def add_argument(*flags, **options) -> argparse.Action:
            action = add_to_group(*flags, **options)
            self.flag_actions.append(action)
            return action

        group.add_argument = add_argument  # the group's flags are recorded like the parser's
        return group

    def defaults(self) -> dict[str, Any]:
        """``get_default(dest)`` for every dest, from one pass over the flags (argparse's
        get_default scans all ~700 actions for each dest it is asked: the facade's namespace
        asked it ~700 times per config). A dest that is not here defaults to None."""
        found: dict[str, Any] = {}
        for action in self.flag_actions:  # argparse's rule: the first non-None action default
            if action.default is not None:
                found.setdefault(action.dest, action.default)
        for dest, value in self._defaults.items():  # then set_defaults() without such an action
            found.setdefault(dest, value)
        return found

    def parse_args(self, args=None, namespace=None):
        """argparse's, but a flag of a workload this fork does not run (out_of_scope_flags.py)
        is named with its family instead of "unrecognized arguments"."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(out_of_scope_flags.unrecognized_message(extras))
        return parsed

    def error(self, message: str):  # noqa: D401 - argparse override
        raise ArgumentValidationError(message)


def _add_network_size_args(parser):
    group = parser.add_argument_group("network size")
    group.add_argument("--num-layers", type=int, required=True,
                       help="Transformer layers.")
    group.add_argument("--hidden-size", type=int, required=True,
                       help="Transformer hidden size.")
    group.add_argument("--ffn-hidden-size", type=int, default=None,
                       help="Default: 4 * hidden size (with --swiglu 8/3 * hidden size, rounded "
                            "down to a multiple of 64, as Megatron-LM).")
    group.add_argument("--num-attention-heads", type=int, required=True,
                       help="Attention heads.")
    group.add_argument("--group-query-attention", action="store_true",
                       help="Grouped-query attention (with --num-query-groups).")
    group.add_argument("--num-query-groups", type=int, default=None,
                       help="Key/value head groups under --group-query-attention (default 1, "
                            "as Megatron-LM's).")
    group.add_argument("--seq-length", "--encoder-seq-length", type=int, required=True,
                       action=validation_arguments.SeqLengthSpellings,
                       help="Maximum tokens of one sample (longer samples are clipped/truncated; "
                            "--encoder-seq-length: Megatron-LM's old spelling).")
    group.add_argument("--max-position-embeddings", type=int, default=None,
                       help="Position table size. Default: --seq-length; must be at least "
                            "--seq-length (padding slots of packed sequences use position 0).")
    group.add_argument("--position-embedding-type", default="learned_absolute",
                       choices=megatron_lm_choices("--position-embedding-type",
                                                   POSITION_EMBEDDING_TYPES),
                       help="Position encoding."
                            + refused_help("--position-embedding-type"))
    group.add_argument("--rotary-base", type=int, default=10000,
                       help="RoPE base.")
    group.add_argument("--normalization", default="LayerNorm", choices=["LayerNorm", "RMSNorm"],
                       help="Norm layer.")
    group.add_argument("--swiglu", action="store_true",
                       help="SwiGLU MLP (gated, SiLU).")
    group.add_argument("--squared-relu", action="store_true",
                       help="Squared-ReLU MLP activation, relu(x)^2 (Megatron-LM's; the "
                            "Nemotron-H recipes'); not with --swiglu.")
    group.add_argument("--quick-geglu", action="store_true",
                       help="Gated MLP with quick-GELU, x*sigmoid(1.702x), on the gate half "
                            "(Megatron-LM's; gpt-oss recipes); not with --swiglu or "
                            "--squared-relu.")
    group.add_argument("--disable-bias-linear", action="store_true",
                       help="No biases in linear layers.")
    group.add_argument("--untie-embeddings-and-output-weights", action="store_true",
                       help="Separate output layer instead of the tied word embedding.")
    group.add_argument("--mtp-num-layers", type=int, default=None,
                       help="Multi-token prediction layers (predict further tokens).")
    group.add_argument("--make-vocab-size-divisible-by", type=int, default=128,
                       help="Pad the vocabulary to a multiple of this x TP size.")
    group.add_argument("--init-method-std", type=float, default=0.02,
                       help="Init std (output projections: std / sqrt(2 x layers); in hybrid "
                            "models std / sqrt(layers), as megatron-core's).")
    group.add_argument("--hidden-dropout", type=float, default=0.1,
                       help="Dropout after attention and MLP.")
    group.add_argument("--attention-dropout", type=float, default=0.1,
                       help="Dropout on attention probabilities.")


def _add_training_args(parser):
    group = parser.add_argument_group("training")
    group.add_argument("--micro-batch-size", type=int, default=1,
                       help="Samples per micro-batch (1 with --sequence-packing: one pack).")
    group.add_argument("--global-batch-size", type=int, default=None,
                       help="Default: micro batch size * data-parallel size.")
    group.add_argument("--train-iters", type=int, default=None,
                       help="Training iterations (optimizer steps); or give --train-samples.")
    group.add_argument("--seed", type=int, default=1234,
                       help="Random seed; weights depend on it, not on the parallel layout.")
    group.add_argument("--calculate-per-token-loss", action="store_true",
                       help="Normalise the loss by the number of loss tokens in the global batch.")
    group.add_argument("--bf16", action="store_true",
                       help="bfloat16 parameters and compute.")
    group.add_argument("--fp16", action="store_true",
                       help="float16 (GPU only: its loss scaler needs CUDA).")
    group.add_argument("--use-distributed-optimizer", action="store_true",
                       help="Shard optimizer state across data-parallel ranks.")
    group.add_argument("--clip-grad", type=float, default=1.0,
                       help="Gradient-norm clip (0 disables).")
    group.add_argument("--weight-decay", type=float, default=0.01,
                       help="Adam weight decay.")
    group.add_argument("--adam-beta1", type=float, default=0.9,
                       help="Adam beta1.")
    group.add_argument("--adam-beta2", type=float, default=0.999,
                       help="Adam beta2.")
    group.add_argument("--adam-eps", type=float, default=1e-8,
                       help="Adam epsilon.")


def _add_learning_rate_args(parser):
    group = parser.add_argument_group("learning rate")
    group.add_argument("--lr", type=float, required=True,
                       help="Peak learning rate.")
    group.add_argument("--min-lr", type=float, default=0.0,
                       help="Learning rate at the end of decay.")
    group.add_argument("--decoupled-lr", type=float, default=None,
                       help="Peak learning rate of the input embedding and the output layer "
                            "(their own schedule, same shape; default --lr).")
    group.add_argument("--decoupled-min-lr", type=float, default=None,
                       help="Their learning rate at the end of decay (default --min-lr; needs "
                            "--decoupled-lr).")
    group.add_argument("--lr-decay-style", default="linear",
                       choices=["constant", "linear", "cosine", "inverse-square-root", "WSD"],
                       help="Learning-rate decay after warm-up.")
    group.add_argument("--lr-decay-iters", type=int, default=None,
                       help="Default: --train-iters.")
    group.add_argument("--lr-warmup-iters", type=int, default=0,
                       help="Linear warm-up iterations.")


def _add_parallel_args(parser):
    group = parser.add_argument_group("distributed")
    group.add_argument("--tensor-model-parallel-size", type=int, default=1,
                       help="TP size.")
    group.add_argument("--pipeline-model-parallel-size", type=int, default=1,
                       help="PP size.")
    group.add_argument("--num-layers-per-virtual-pipeline-stage", type=int, default=None,
                       help="Layers per virtual stage (interleaved 1F1B, VPP).")
    group.add_argument("--context-parallel-size", type=int, default=1,
                       help="Static CP size (sequences split into 2 x CP chunks).")
    group.add_argument("--sequence-parallel", action="store_true",
                       help="Sequence parallelism inside TP regions (with TP 1 turned off with "
                            "Megatron-LM's warning).")


def _add_data_args(parser):
    group = parser.add_argument_group("data and tokenizer")
    group.add_argument("--mock-data", action="store_true",
                       help="Synthetic data (fixed length; with --sft, variable-length SFT mock).")
    group.add_argument("--data-path", nargs="+", default=None, metavar="[WEIGHT] PREFIX",
                       help="Training data: Megatron indexed datasets (.bin/.idx prefixes, "
                            "optionally weighted: '0.7 PREFIX_A 0.3 PREFIX_B'), split by "
                            "--split; with --sft a JSONL of chats or prompt/response.")
    group.add_argument("--tokenizer-type", default="NullTokenizer",
                       choices=TOKENIZER_TYPE_CHOICES,
                       help="NullTokenizer (ids as text), ByteLevelTokenizer (UTF-8 bytes, no "
                            "download), a local HuggingFace tokenizer, GPT2BPETokenizer "
                            "(--vocab-file, --merge-file), the SentencePiece types and "
                            "TikTokenizer (--tokenizer-model FILE); Megatron-LM's other types "
                            "are refused with the reason.")
    group.add_argument("--tokenizer-model", default=None,
                       help="HuggingFaceTokenizer: a local tokenizer directory; SentencePiece "
                            "types: the .model file; TikTokenizer: the vocabulary JSON "
                            "(refused beside another type).")
    group.add_argument("--vocab-size", type=int, default=None,
                       help="Vocabulary size (NullTokenizer; TikTokenizer's, default 2^17); "
                            "other tokenizers know their own.")


def _add_logging_checkpoint_args(parser):
    group = parser.add_argument_group("logging, evaluation and checkpointing")
    group.add_argument("--log-interval", type=int, default=100,
                       help="Print the iteration log line every N iterations (and after the "
                            "first), loss, time and throughput averaged over them, as "
                            "Megatron-LM.")
    group.add_argument("--log-throughput", action="store_true",
                       help="Print 'throughput per GPU (TFLOP/s/GPU)' on the iteration line, "
                            "as Megatron-LM (the JSONL record always carries it; with "
                            "--log-timers-to-tensorboard it adds the 'throughput' scalar).")
    group.add_argument("--log-metrics-jsonl", default=None,
                       help="Write one JSON object per iteration to this path.")
    group.add_argument("--tensorboard-dir", default=None,
                       help="Write every iteration's metrics as TensorBoard scalars here (needs "
                            "the tensorboard package: the [metrics] extra).")
    group.add_argument("--log-validation-ppl-to-tensorboard", action="store_true",
                       help="Also write each evaluation's perplexity to TensorBoard (Megatron-LM's "
                            "'lm loss validation ppl' and '... ppl vs samples'; with "
                            "--tensorboard-dir).")
    group.add_argument("--log-params-norm", action="store_true",
                       help="Report the L2 norm of the model's weights after each step.")
    group.add_argument("--log-num-zeros-in-grad", action="store_true",
                       help="Report the number of zero entries in each step's gradients.")
    group.add_argument("--timing-log-level", type=int, default=0, choices=range(0, 3),
                       help="What Megatron-LM's timers measure: 0 the step time only, 1 also "
                            "forward-backward, gradient reductions and optimizer phases, 2 also "
                            "each micro-batch's compute and pipeline communication.")
    group.add_argument("--timing-log-option", default="minmax", choices=["max", "minmax", "all"],
                       help="How the timers are printed every --log-interval: the max over "
                            "ranks, min and max, or every rank's.")
    group.add_argument("--log-timers-to-tensorboard", action="store_true",
                       help="Write the timers (and iteration-time) to TensorBoard and wandb.")
    group.add_argument("--no-barrier-with-level-1-timing", action="store_false",
                       dest="barrier_with_L1_time",
                       help="Level-1 timers start without a barrier across ranks (their times "
                            "then include waiting for other ranks).")
    group.add_argument("--tensorboard-log-interval", type=int, default=1,
                       help="Write TensorBoard and wandb scalars every N iterations.")
    group.add_argument("--wandb-project", default=None,
                       help="Log every iteration's metrics to this wandb project (needs the "
                            "wandb package: the [metrics] extra); offline unless $WANDB_MODE "
                            "or $WANDB_API_KEY says otherwise.")
    group.add_argument("--wandb-exp-name", default=None,
                       help="The wandb run's name (with --wandb-project).")
    group.add_argument("--wandb-save-dir", default=None,
                       help="Where wandb keeps its files (with --wandb-project).")
    group.add_argument("--eval-interval", type=int, default=1000,
                       help="Evaluate on the validation split every N iterations (and at the "
                            "end of training, then on the test split).")
    group.add_argument("--eval-iters", type=int, default=100,
                       help="Global batches per evaluation, validation or test (0 = none).")
    group.add_argument("--save", default=None,
                       help="Checkpoint directory to write (dist_checkpointing, torch_dist).")
    group.add_argument("--load", default=None,
                       help="Checkpoint directory to resume from (must exist).")
    group.add_argument("--save-interval", type=int, default=None,
                       help="Save every N iterations (and at the end).")


def build_parser(prog: str = "pretrain_gpt.py") -> argparse.ArgumentParser:
    """The full CLI of pretrain_gpt.py (``prog``: the program name usage lines and errors show,
    for other entry points that take the same flags)."""
    parser = MegatronArgumentParser(
        prog=prog, description="Megatron GPT training (varlen fork)",
        allow_abbrev=False,
    )
    _add_network_size_args(parser)
    _add_training_args(parser)
    _add_learning_rate_args(parser)
    schedule_arguments.add_schedule_args(parser)
    loss_scale_arguments.add_loss_scale_args(parser)
    _add_parallel_args(parser)
    _add_data_args(parser)
    sft_arguments.add_sft_data_args(parser)
    _add_logging_checkpoint_args(parser)
    logging_arguments.add_logging_args(parser)
    data_arguments.add_indexed_data_args(parser)
    tokenizer_arguments.add_tokenizer_file_args(parser)
    varlen_arguments.add_varlen_args(parser)
    document_arguments.add_document_args(parser)
    hf_arguments.add_hf_args(parser)
    reliability_arguments.add_reliability_args(parser)
    recompute_arguments.add_recompute_args(parser)
    recipe_arguments.add_recipe_args(parser)
    checkpoint_arguments.add_checkpoint_args(parser)
    moe_arguments.add_moe_args(parser)
    model_arguments.add_model_args(parser)
    attention_window_arguments.add_window_args(parser)
    mla_arguments.add_mla_args(parser)
    kernel_arguments.add_kernel_args(parser)
    pipeline_arguments.add_pipeline_split_args(parser)
    runtime_arguments.add_runtime_args(parser)
    optimizer_arguments.add_optimizer_args(parser)
    ddp_arguments.add_ddp_args(parser)
    checkpoint_save_arguments.add_checkpoint_save_args(parser)
    dataloader_arguments.add_dataloader_args(parser)
    training_loop_arguments.add_training_loop_args(parser)
    megatron_lm_census_flags.add_census_flags(parser)
    validation_arguments.add_validation_args(parser)
    return parser


def _world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def _validate_parallel_sizes(args) -> None:
    model_parallel = (args.tensor_model_parallel_size * args.pipeline_model_parallel_size
                      * args.context_parallel_size)
    require(
        args.world_size % model_parallel == 0,
        f"world size {args.world_size} is not divisible by --tensor-model-parallel-size "
        f"{args.tensor_model_parallel_size} x --pipeline-model-parallel-size "
        f"{args.pipeline_model_parallel_size} x --context-parallel-size "
        f"{args.context_parallel_size} = {model_parallel}",
    )
    args.data_parallel_size = args.world_size // model_parallel
    require(args.num_attention_heads % args.tensor_model_parallel_size == 0,
            f"--num-attention-heads {args.num_attention_heads} is not divisible by "
            f"--tensor-model-parallel-size {args.tensor_model_parallel_size}")
    if args.sequence_parallel and args.tensor_model_parallel_size == 1:
        # Megatron-LM's validate_args: recipes pass --sequence-parallel whatever their TP size
        # (its Mixtral example with TP 1), and the flag then changes nothing.
        warning_rank_0(SEQUENCE_PARALLEL_OFF)
        args.sequence_parallel = False


def _validate_sequence_length(args) -> None:
    if args.max_position_embeddings is None:
        args.max_position_embeddings = args.seq_length
    # The position table covers every real token: packing puts padding at position 0
    # (megatron/varlen/packing/thd_microbatch.py), so no padded length needs a row of its own.
    require(args.seq_length <= args.max_position_embeddings,
            f"--seq-length {args.seq_length} exceeds --max-position-embeddings "
            f"{args.max_position_embeddings} (raise --max-position-embeddings)")
    divisor = pad_multiple(args.context_parallel_size,
                           args.tensor_model_parallel_size if args.sequence_parallel else 1)
    require(args.seq_length % divisor == 0,
            f"--seq-length {args.seq_length} is not divisible by {divisor}, which "
            f"--context-parallel-size {args.context_parallel_size} (2 x cp chunks) and "
            f"--sequence-parallel need")


def _validate_batch(args) -> None:
    micro_times_dp = args.micro_batch_size * args.data_parallel_size
    if args.global_batch_size is None:
        args.global_batch_size = micro_times_dp
    require(args.global_batch_size % micro_times_dp == 0,
            f"--global-batch-size {args.global_batch_size} is not divisible by "
            f"--micro-batch-size {args.micro_batch_size} x data-parallel size "
            f"{args.data_parallel_size}")
    args.num_microbatches = args.global_batch_size // micro_times_dp


def _validate_precision_and_data(args) -> None:
    import torch

    require(not (args.bf16 and args.fp16), "--bf16 and --fp16 are mutually exclusive")
    require(not (args.fp16 and not torch.cuda.is_available()),
            "--fp16 needs a GPU (its loss scaler is CUDA-only); use --bf16 on CPU")
    if args.tokenizer_type == "NullTokenizer":
        require(args.vocab_size is not None and args.vocab_size > 1,
                f"--tokenizer-type NullTokenizer needs --vocab-size > 1 (got {args.vocab_size})")
    require(args.mock_data or args.data_path or args.train_data_path,
            "no training data: pass --mock-data, --data-path or --train-data-path")
    load_problem = recipe_arguments.load_dir_problem(args.load, args.pretrained_checkpoint,
                                                     args.save, args.exit_on_missing_checkpoint)
    require(load_problem is None, load_problem)
    schedule_arguments.validate_schedule(args, require)  # --train-iters or --train-samples
    loss_scale_arguments.validate_loss_scale_args(args, require)
    activations = [flag for flag, given in (("--swiglu", args.swiglu),
                                            ("--squared-relu", args.squared_relu),
                                            ("--quick-geglu", args.quick_geglu)) if given]
    require(len(activations) <= 1,
            f"{' and '.join(activations)} are MLP activations: give one (Megatron-LM asserts "
            f"the same)")
    if args.ffn_hidden_size is None:
        args.ffn_hidden_size = default_ffn_hidden_size(args.hidden_size, args.swiglu)
    if not args.group_query_attention:
        args.num_query_groups = args.num_attention_heads
    elif args.num_query_groups is None:  # Megatron-LM's default: one group (multi-query)
        args.num_query_groups = MEGATRON_LM_NUM_QUERY_GROUPS
    tp = args.tensor_model_parallel_size
    require(args.ffn_hidden_size % tp == 0,
            f"--ffn-hidden-size {args.ffn_hidden_size} is not divisible by "
            f"--tensor-model-parallel-size {tp} (set --ffn-hidden-size explicitly)")
    require(args.num_query_groups % tp == 0,
            f"--num-query-groups {args.num_query_groups} is not divisible by "
            f"--tensor-model-parallel-size {tp}")


SWIGLU_FFN_MULTIPLE = 64  # Megatron-LM rounds the SwiGLU default down to a multiple of 64


def default_ffn_hidden_size(hidden_size: int, swiglu: bool) -> int:
    """Megatron-LM's default --ffn-hidden-size: 4h, or with --swiglu 2/3 of that rounded DOWN
    to a multiple of 64 (the same parameter count as a 4h GELU MLP, in 64-wide tiles)."""
    if not swiglu:
        return 4 * hidden_size
    size = int(4 * hidden_size * 2 / 3 / SWIGLU_FFN_MULTIPLE) * SWIGLU_FFN_MULTIPLE
    require(size > 0, f"--swiglu with --hidden-size {hidden_size}: Megatron-LM's default "
                      f"--ffn-hidden-size (8h/3 rounded down to a multiple of "
                      f"{SWIGLU_FFN_MULTIPLE}) is 0; set --ffn-hidden-size")
    return size


def validate_args(args: argparse.Namespace, check_memory: bool = True) -> argparse.Namespace:
    """Checks flag combinations; returns a copy of ``args`` with the derived fields filled in
    (data_parallel_size, the sample counts, ...). ``args`` itself stays as parsed, so the same
    namespace validates again (the derived sample count would otherwise read as a given
    ``--train-samples`` beside ``--train-iters``).

    ``check_memory``: refuse a GPT model that cannot fit this machine
    (:func:`flag_ranges.validate_memory`); pretrain_mamba.py checks its hybrid stack instead.
    """
    args = copy.deepcopy(args)
    args.world_size = getattr(args, "world_size", None) or _world_size()
    validate_refused_choices(args, require)  # first: every later check reads built values
    flag_ranges.validate_ranges(args, require)  # first: later checks divide by these
    flag_ranges.validate_relations(args, require)
    _validate_parallel_sizes(args)
    # the split of --num-layers over the stages; resolves the virtual pipeline size
    pipeline_arguments.validate_pipeline_split(args, require)
    _validate_sequence_length(args)
    _validate_batch(args)
    _validate_precision_and_data(args)
    kernel_arguments.validate_kernel_args(args, require)  # first: resolves deprecated aliases
    model_arguments.validate_model_args(args, require)
    attention_window_arguments.validate_window_args(args, require)
    varlen_arguments.validate_varlen_args(args, require)
    pipeline_arguments.validate_microbatch_group(args, require)  # after the micro-batch count
    sft_arguments.validate_sft_data_args(args, require)
    data_arguments.validate_indexed_data_args(args, require)
    tokenizer_arguments.validate_tokenizer_args(args, require)
    document_arguments.validate_document_args(args, require,
                                              varlen_arguments.attention_backend(args))
    moe_arguments.validate_moe_args(args, require)
    mla_arguments.validate_mla_args(args, require)
    hf_arguments.validate_hf_args(args, require)
    reliability_arguments.validate_reliability_args(args, require)
    recompute_arguments.validate_recompute_args(args, require)
    recipe_arguments.validate_recipe_args(args, require)
    checkpoint_arguments.validate_checkpoint_args(args, require)
    runtime_arguments.validate_runtime_args(args, require)
    optimizer_arguments.validate_optimizer_args(args, require)
    ddp_arguments.validate_ddp_args(args, require)
    checkpoint_save_arguments.validate_checkpoint_save_args(args, require)
    dataloader_arguments.validate_dataloader_args(args, require)
    training_loop_arguments.validate_training_loop_args(args, require)
    megatron_lm_census_flags.validate_census_flags(args, require)
    validation_arguments.validate_validation_args(args, require)
    flag_ranges.validate_metrics_path(args, require)
    flag_ranges.validate_metric_writers(args, require)
    logging_arguments.validate_logging_args(args, require)
    # Derived once here (vocabulary from a tokenizer: RunConfig.with_vocabulary).
    vars(args).update(run_description.derive_run_values(args, args.vocab_size))
    if check_memory:
        flag_ranges.validate_memory(args, require,
                                    args.num_layers * flag_ranges.gpt_layer_parameters(args))
    return args


def parse_args(argv: list[str] | None = None, world_size: int | None = None,
               prog: str = "pretrain_gpt.py"):
    """Parses and validates; raises ArgumentValidationError with a one-line message."""
    parser = build_parser(prog)
    argv = sys.argv[1:] if argv is None else argv
    try:  # --hf-checkpoint: the checkpoint's architecture as defaults, checked for conflicts
        fixed = hf_arguments.apply_checkpoint_defaults(parser, hf_arguments.checkpoint_dir(argv))
        # --use-checkpoint-args: the loaded checkpoint's model flags (checkpoint_model_flags.py)
        taken = checkpoint_model_flags.read_checkpoint_flags(argv)
        checkpoint_model_flags.apply_as_defaults(parser, taken)
        args = parser.parse_args(argv)
        checkpoint_model_flags.override_command_line(args, taken)
        hf_arguments.check_conflicts(parser, args, fixed)
    except ValueError as err:  # HFConfigError: one line, like every argument error
        raise ArgumentValidationError(str(err)) from err
    args.world_size = world_size
    return validate_args(args)


@contextlib.contextmanager
def exit_on_flag_errors(prog: str):
    """For entry points: a bad flag prints one line and exits with code 2 (never a hang)."""
    try:
        yield
    except ArgumentValidationError as err:  # peers waiting for this rank are told first
        report_start_up_error(prog, err)


def parse_args_or_exit(argv: list[str] | None = None,
                       prog: str = "pretrain_gpt.py") -> argparse.Namespace:
    """:func:`parse_args`; a user error prints one line and exits with code 2."""
    with exit_on_flag_errors(prog):
        return parse_args(argv, prog=prog)


ARGUMENTS_DOTS_COLUMN = 48  # Megatron-LM's arguments dump pads each name with dots to here


def format_arguments(flags: Mapping[str, Any]) -> str:
    """Megatron-LM's arguments dump (every flag's value, sorted by name), as its start-up shows::

        ------------------------ arguments ------------------------
          seq_length ...................................... 512
        -------------------- end of arguments ---------------------
    """
    lines = [f"  {name} {'.' * (ARGUMENTS_DOTS_COLUMN - len(name))} {value}"
             for name, value in sorted(flags.items())]
    return "\n".join(["------------------------ arguments ------------------------", *lines,
                      "-------------------- end of arguments ---------------------"])
