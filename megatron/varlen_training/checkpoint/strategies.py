"""How dist_checkpointing saves and loads a checkpoint: Megatron-LM's
``--ckpt-fully-parallel-save`` (its default) and ``--ckpt-fully-parallel-load`` choose
megatron-core's fully parallel strategies, which spread the writes / reads of replicated shards
over the data-parallel ranks; the checkpoint's content is the same either way
(checkpoint_save_arguments.py has the flags)."""

from __future__ import annotations

from megatron.core import parallel_state
from megatron.core.dist_checkpointing.serialization import (
    get_default_load_sharded_strategy, get_default_save_sharded_strategy,
)
from megatron.core.dist_checkpointing.strategies.fully_parallel import (
    FullyParallelLoadStrategyWrapper, FullyParallelSaveStrategyWrapper,
)
from megatron.varlen_training.config.checkpoint import CheckpointConfig


def _data_parallel_group():
    """The ranks holding replicas of the same shards, over which the work is spread."""
    return parallel_state.get_data_parallel_group(with_context_parallel=True)


def save_strategy(checkpoint: CheckpointConfig):
    """torch_dist's save strategy; fully parallel (the replicas share the writes) unless
    --no-ckpt-fully-parallel-save, as Megatron-LM's."""
    strategy = get_default_save_sharded_strategy()
    if checkpoint.ckpt_fully_parallel_save:
        strategy = FullyParallelSaveStrategyWrapper(strategy, _data_parallel_group())
    return strategy


def load_strategy(checkpoint: CheckpointConfig, folder: str):
    """The load strategy for ``folder``; with --ckpt-fully-parallel-load the replicas share
    the reads and exchange what they read, as Megatron-LM's."""
    strategy = get_default_load_sharded_strategy(folder)
    if checkpoint.ckpt_fully_parallel_load:
        strategy = FullyParallelLoadStrategyWrapper(strategy, _data_parallel_group())
    return strategy
