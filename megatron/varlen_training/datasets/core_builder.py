"""megatron-core's ``BlendedMegatronDatasetBuilder``, with the ranks' turns and their agreement
ours instead of its barriers.

megatron-core builds on global rank 0 first (which writes the sample-index cache, under
``--data-cache-path``), meets every rank at ``torch.distributed.barrier()``, then builds on the
others (which read the cache). A rank that fails between two barriers -- rank 0 writing the cache
on a full disk, a read-only or vanished directory -- leaves the others waiting at the next one
until the process-group timeout (gloo peers are freed only when the failed process exits; NCCL
peers wait it out). The start-up checks (indexed_checks.py) catch what can be foreseen; this
module covers the rest:

1. rank 0 runs megatron-core's builder alone (no barrier inside: :class:`RankLocalBuilder`),
2. every rank learns whether it worked (one ``all_gather_object``: our barrier, with a status),
3. the other ranks build from the cache, and every rank learns whether that worked.

A failure on any rank then ends every rank with the same one-line :class:`UserInputError`
(a bug keeps its traceback on the rank where it happened, the others stop in one line naming
it: ``errors.agree_on_errors`` does both); the datasets built are megatron-core's own, from the
same builder code, in the same rank order.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from megatron.core.datasets.blended_megatron_dataset_builder import (
    BlendedMegatronDatasetBuilder,
)
from megatron.core.datasets.utils import Split

from megatron.varlen_training.errors import UserInputError, agree_on_errors, one_line
from megatron.varlen_training.log import is_multi_rank

BUILDING_RANK = 0  # megatron-core's cache writer: global rank 0
CACHE_HINT = "--data-cache-path must name a writable directory with free space"


class RankLocalBuilder(BlendedMegatronDatasetBuilder):
    """megatron-core's builder that never waits for other ranks: the caller orders the ranks
    (:func:`build_in_rank_order`). Everything else -- splits, blends, sizes, the datasets and
    their cache -- is megatron-core's."""

    @staticmethod
    def build_generic_dataset(cls, is_built_on_rank: Callable, synchronize_ranks: bool,
                              *args: Any):
        """megatron-core's per-dataset step without its rank-0-first barrier (and without
        rewrapping an OSError into a bare ``Exception``: the caller reports it)."""
        return cls(*args) if is_built_on_rank() else None

    def _build_megatron_datasets_parallel(self, prefixes, split, sizes_per_dataset):
        """The datasets of a blend, prefix by prefix, per split, without megatron-core's
        barrier between rank 0 and the others (its thread pool only overlaps cache I/O)."""
        per_split = [[] for _ in Split]
        for prefix, sizes in zip(prefixes, sizes_per_dataset):
            built = self._build_megatron_dataset_splits(prefix, split, sizes, False)
            for datasets, dataset in zip(per_split, built):
                datasets.append(dataset)
        return per_split


def _failure_message(err: Exception) -> str:
    if isinstance(err, OSError):  # the cache: a full disk, a read-only or missing directory
        return f"megatron-core could not build its datasets: {one_line(err)} ({CACHE_HINT})"
    return f"megatron-core's dataset builder raised {type(err).__name__}: {one_line(err)}"


def _build(build: Callable[[], Any] | None) -> Any:
    """This rank's turn (None: not its turn); a user error names the rank (rank 0 writes the
    cache, the others read it: which one failed tells where to look)."""
    if build is None:
        return None
    try:
        return build()
    except (OSError, ValueError) as err:
        where = f"rank {torch.distributed.get_rank()}: " if is_multi_rank() else ""
        raise UserInputError(where + _failure_message(err)) from err


def _turn(build: Callable[[], Any] | None) -> Any:
    """Runs ``build`` (None: not this rank's turn), then shares the outcome with every rank
    (:func:`agree_on_errors`: a user error on every rank; a bug keeps its traceback on its rank
    and stops the others in one line)."""
    return agree_on_errors(_build, build)


def build_in_rank_order(builder: BlendedMegatronDatasetBuilder) -> list:
    """``builder.build()`` on global rank 0, then on the other ranks (from the cache rank 0
    wrote); a failure on any rank raises on every rank (:func:`_turn`)."""
    if not is_multi_rank():
        return _turn(builder.build)
    first = torch.distributed.get_rank() == BUILDING_RANK
    built = _turn(builder.build if first else None)
    later = _turn(None if first else builder.build)
    return built if first else later
