"""``pretrain(run)``: tokenizer, datasets, model, loop -- what pretrain_gpt.py runs."""

from __future__ import annotations

from megatron.varlen_training.config import RunConfig
from megatron.varlen_training.data import (
    PackedBatchProvider, UnpackedBatchProvider, build_packing_config,
)
from megatron.varlen_training.datasets.builder import build_datasets
from megatron.varlen_training.errors import agree_on_errors
from megatron.varlen_training.exit_conditions import ExitConditions
from megatron.varlen_training.log import print_rank_0
from megatron.varlen_training.model_family import GPT, ModelFamily
from megatron.varlen_training.tokenizer import build_tokenizer, check_tokenizer_fits
from megatron.varlen_training.training import setup_model_and_optimizer, train
from megatron.varlen.data_schedule import GlobalBatchPacker
from megatron.varlen.dynamic_cp_groups import initialize_dynamic_cp_groups
from megatron.varlen.scheduling.groups import build_group_layout


def create_dynamic_cp_groups(run: RunConfig):
    """Dynamic CP: create every group the scheduler may pick; returns their lookup (or None)."""
    if not run.packing.dynamic_context_parallel:
        return None
    parallel = run.parallel
    layout = build_group_layout(parallel.dp_cp_size, run.packing.min_dynamic_context_parallel_size,
                                parallel.context_parallel_size)
    registry = initialize_dynamic_cp_groups(layout)
    print_rank_0(f"> dynamic context parallel: {parallel.dp_cp_size} DP x CP ranks, CP group "
                 f"sizes {list(layout.sequence_sizes)}, {registry.groups_per_rank()} process "
                 f"groups per rank ({len(layout.groups)} blocks per DP x CP group)")
    return registry.lookup


def build_tokenizer_and_describe_run(run: RunConfig):
    """(tokenizer, the run with the tokenizer's vocabulary): what everything after reads."""
    # Data errors (bad file, line, bytes) are one line on every rank, never a traceback wall.
    tokenizer = agree_on_errors(build_tokenizer, run.data.tokenizer_type, run.model.vocab_size,
                                run.data.tokenizer_model)
    run = run.with_vocabulary(tokenizer.vocab_size)
    check_tokenizer_fits(tokenizer, run.model.vocab_size)
    return tokenizer, run


def build_data_providers(run: RunConfig, tokenizer=None, family: ModelFamily = GPT):
    """Tokenizer-aware datasets wrapped in the step-batch provider the loop consumes (without
    ``tokenizer`` it is built here, and ``run`` given its vocabulary)."""
    if tokenizer is None:
        tokenizer, run = build_tokenizer_and_describe_run(run)
    train_ds, valid_ds = agree_on_errors(build_datasets, run, tokenizer)
    gbs = run.training.global_batch_size
    if run.packing.sequence_packing:
        config = build_packing_config(run, tokenizer.pad, family.attention_fraction(run.model))
        lookup = create_dynamic_cp_groups(run)
        make = lambda ds: PackedBatchProvider(  # noqa: E731
            ds, gbs, GlobalBatchPacker(config, group_lookup=lookup))
    else:
        make = lambda ds: UnpackedBatchProvider(  # noqa: E731
            ds, gbs, run.training.micro_batch_size, run.model.seq_length)
    return make(train_ds), (make(valid_ds) if valid_ds is not None else None)


def pretrain(run: RunConfig, family: ModelFamily = GPT) -> list[dict]:
    """Trains a model of ``family`` (GPT unless told) as ``run`` says; returns
    {"lm_loss", "grad_norm"} per iteration.

    The clock of --exit-duration-in-mins and the signal handling of --exit-signal-handler start
    here, before set-up: a job's wall-clock limit counts set-up too, and a SIGTERM during it
    then stops the run after its first iteration, saved, instead of killing it.
    """
    with ExitConditions.of(run.training) as exits:
        tokenizer, run = build_tokenizer_and_describe_run(run)
        train_provider, valid_provider = build_data_providers(run, tokenizer, family)
        state = setup_model_and_optimizer(run, family)
        return train(run, state, train_provider, valid_provider, exits, family)
