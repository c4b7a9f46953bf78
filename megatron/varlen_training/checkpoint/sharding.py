"""How a checkpoint's optimizer state is laid out: megatron-core's sharded-state-dict metadata.

megatron-core builds the optimizer's sharded state dict from a small metadata dict (Megatron-LM's
``_build_sharded_state_dict_metadata``), and dist_checkpointing stores it in the checkpoint as
its *content metadata*. As in Megatron-LM, a save builds it from this run's flags and a load
builds its template from the metadata the checkpoint was saved with, so a checkpoint loads in
the format it holds whatever this run saves next:

- ``--use-distributed-optimizer``: ``distrib_optim_sharding_type`` is ``dp_reshardable``
  (default: one shard per data-parallel group of gradient buckets, resumable at another
  data-parallel size only) or, with ``--dist-ckpt-optim-fully-reshardable``,
  ``fully_reshardable`` (the state gathered to model-parameter shapes, keyed and sharded like
  the weights: resumable at another TP, PP, EP, expert-TP and virtual-pipeline layout too);
  ``--distrib-optim-fully-reshardable-mem-efficient`` gathers it over gloo to data-parallel
  rank 0 alone (less memory, no parallel save; the same checkpoint content).
- ``chained_optim_avoid_prefix`` (Megatron-LM sets it on every save): with expert parallelism
  the dense and the expert optimizer are chained, and their per-parameter tensors are keyed by
  parameter alone instead of ``chained_<i>.``-prefixed (megatron-core keeps the prefix for the
  ``dp_reshardable`` format, whose keys name buffers, not parameters).

Checkpoints saved before the metadata was stored were built with :data:`LEGACY_METADATA`.
"""

from __future__ import annotations

from megatron.varlen_training.config import RunConfig

SHARDING_TYPE_KEY = "distrib_optim_sharding_type"
MEM_EFFICIENT_KEY = "distrib_optim_fully_reshardable_mem_efficient"
AVOID_PREFIX_KEY = "chained_optim_avoid_prefix"
SINGLETON_SHARDS_KEY = "singleton_local_shards"
DP_RESHARDABLE = "dp_reshardable"
FULLY_RESHARDABLE = "fully_reshardable"
# What every save here passed before the metadata was stored (also for the plain optimizer,
# so its chained EP > 1 keys carry the ``chained_<i>.`` prefix).
LEGACY_METADATA = {SHARDING_TYPE_KEY: DP_RESHARDABLE}


def optimizer_sharding_type(run: RunConfig) -> str | None:
    """The distributed optimizer's checkpoint format this run saves (None: plain optimizer)."""
    if not run.optimizer.use_distributed_optimizer:
        return None
    return FULLY_RESHARDABLE if run.checkpoint.dist_ckpt_optim_fully_reshardable \
        else DP_RESHARDABLE


def save_metadata(run: RunConfig) -> dict:
    """The metadata this run's saves build the optimizer state with (and store)."""
    metadata = {SINGLETON_SHARDS_KEY: False, AVOID_PREFIX_KEY: True}
    sharding_type = optimizer_sharding_type(run)
    if sharding_type is not None:
        metadata[SHARDING_TYPE_KEY] = sharding_type
    if sharding_type == FULLY_RESHARDABLE:
        metadata[MEM_EFFICIENT_KEY] = run.checkpoint.distrib_optim_fully_reshardable_mem_efficient
    return metadata


def load_metadata(stored: dict | None) -> dict:
    """The metadata a load builds its template with: what the checkpoint was saved with
    (``stored``, its content metadata), or :data:`LEGACY_METADATA` for checkpoints saved before
    it was stored (None)."""
    return dict(LEGACY_METADATA) if stored is None else dict(stored)
