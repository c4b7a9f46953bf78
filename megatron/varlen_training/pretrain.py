"""``pretrain(args)``: tokenizer, datasets, model, loop -- what pretrain_gpt.py runs."""

from __future__ import annotations

import torch

from megatron.varlen_training.data import (
    PackedBatchProvider, UnpackedBatchProvider, build_packing_config,
)
from megatron.varlen_training.datasets.builder import build_datasets
from megatron.varlen_training.errors import agree_on_errors
from megatron.varlen_training.exit_conditions import ExitConditions
from megatron.varlen_training.log import print_rank_0
from megatron.varlen_training.run_description import describe_run
from megatron.varlen_training.tokenizer import build_tokenizer, check_tokenizer_fits
from megatron.varlen_training.training import gpt_model_provider, setup_model_and_optimizer, train
from megatron.varlen.platform import initialize_dynamic_cp_groups
from megatron.varlen.scheduling import build_group_layout


def create_dynamic_cp_groups(args):
    """Dynamic CP: create every group the scheduler may pick; returns their lookup (or None)."""
    if not args.dynamic_context_parallel:
        return None
    num_ranks = args.data_parallel_size * args.context_parallel_size
    layout = build_group_layout(num_ranks, args.min_dynamic_context_parallel_size,
                                args.context_parallel_size)
    registry = initialize_dynamic_cp_groups(layout)
    print_rank_0(f"> dynamic context parallel: {num_ranks} DP x CP ranks, CP group sizes "
                 f"{list(layout.sequence_sizes)}, {registry.groups_per_rank()} process groups per "
                 f"rank ({len(layout.groups)} blocks per DP x CP group)")
    return registry.lookup


def build_tokenizer_and_describe_run(args):
    """(tokenizer, the read-only run description): what everything after this reads."""
    # Data errors (bad file, line, bytes) are one line on every rank, never a traceback wall.
    tokenizer = agree_on_errors(build_tokenizer, args.tokenizer_type, args.vocab_size,
                                args.tokenizer_model)
    run = describe_run(args, tokenizer.vocab_size)
    check_tokenizer_fits(tokenizer, run.vocab_size)
    return tokenizer, run


def build_data_providers(args, tokenizer=None):
    """Tokenizer-aware datasets wrapped in the step-batch provider the loop consumes
    (``args``: the run description; without ``tokenizer`` both are built here)."""
    if tokenizer is None:
        tokenizer, args = build_tokenizer_and_describe_run(args)
    train_ds, valid_ds = agree_on_errors(build_datasets, args, tokenizer)
    if args.sequence_packing:
        config = build_packing_config(args, tokenizer.pad)
        lookup = create_dynamic_cp_groups(args)
        make = lambda ds: PackedBatchProvider(ds, args, config, lookup)  # noqa: E731
    else:
        make = lambda ds: UnpackedBatchProvider(ds, args)  # noqa: E731
    return make(train_ds), (make(valid_ds) if valid_ds is not None else None)


def pretrain(args, model_provider=gpt_model_provider) -> list[dict]:
    """Trains the model ``model_provider`` builds (GPT unless told) as the flags say; returns
    {"lm_loss", "grad_norm"} per iteration.

    The clock of --exit-duration-in-mins and the signal handling of --exit-signal-handler start
    here, before set-up: a job's wall-clock limit counts set-up too, and a SIGTERM during it
    then stops the run after its first iteration, saved, instead of killing it.
    """
    with ExitConditions(args) as exits:
        tokenizer, run = build_tokenizer_and_describe_run(args)
        train_provider, valid_provider = build_data_providers(run, tokenizer)
        state = setup_model_and_optimizer(run, model_provider)
        return train(run, state, train_provider, valid_provider, exits)
