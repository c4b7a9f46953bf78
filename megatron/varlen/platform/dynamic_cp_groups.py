"""The one owner of dynamic context-parallel process groups.

Which groups exist is decided by the pure :class:`GroupLayout` (scheduling/groups.py): blocks of
DP x CP rank indices. This module turns them into process groups, once, at initialisation:
inside every DP x CP group of the world (one per TP x PP coordinate) it creates each block of
each size, looked up later by the block's rank indices. Sizes that coincide with groups
megatron already has are reused, not duplicated: the static CP groups (size cp) and the whole
DP x CP group (size N). ``destroy()`` frees them with the rest of parallel state (megatron's
destroy_model_parallel does not know about them).
"""

from __future__ import annotations

import torch.distributed as dist

from megatron.core import parallel_state
from megatron.varlen.scheduling.groups import GroupLayout

_REGISTRY: "DynamicCPGroups | None" = None


def _all_dp_cp_rank_lists() -> list[tuple[int, ...]]:
    """Global ranks of every DP x CP group in the world, in a deterministic order."""
    mine = tuple(dist.get_process_group_ranks(
        parallel_state.get_data_parallel_group(with_context_parallel=True)))
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return sorted(set(gathered))


class DynamicCPGroups:
    """Process groups for every block of ``layout``, keyed by DP x CP rank indices."""

    def __init__(self, layout: GroupLayout):
        self.layout = layout
        self.cp_size = parallel_state.get_context_parallel_world_size()
        self._groups: dict[tuple[int, ...], object] = {}
        self._owned: list = []
        my_ranks = tuple(dist.get_process_group_ranks(
            parallel_state.get_data_parallel_group(with_context_parallel=True)))
        for dp_cp_ranks in _all_dp_cp_rank_lists():
            self._create_blocks(dp_cp_ranks, mine=dp_cp_ranks == my_ranks)

    def _reused(self, block: tuple[int, ...]):
        if len(block) == self.layout.num_ranks:
            return parallel_state.get_data_parallel_group(with_context_parallel=True)
        if len(block) == self.cp_size:
            return parallel_state.get_context_parallel_group()
        return None

    def _create_blocks(self, dp_cp_ranks: tuple[int, ...], mine: bool) -> None:
        # Every rank of the world calls new_group for every block, in the same order
        # (torch.distributed requires it); each keeps only the groups of its own DP x CP group.
        for block in self.layout.groups:
            if len(block) in (self.cp_size, self.layout.num_ranks):
                if mine:
                    self._groups[block] = self._reused(block)
                continue
            group = dist.new_group([dp_cp_ranks[i] for i in block])
            if mine:
                self._groups[block] = group
                if group is not dist.GroupMember.NON_GROUP_MEMBER:
                    self._owned.append(group)

    def lookup(self, block: tuple[int, ...]):
        """The process group of a block of DP x CP rank indices (this rank must be in it)."""
        try:
            return self._groups[tuple(block)]
        except KeyError:
            raise KeyError(f"CP group {tuple(block)} was never created; layout sizes "
                           f"{self.layout.sizes}") from None

    def groups_per_rank(self) -> int:
        """Process groups this rank belongs to for dynamic CP (the start-up cost reported)."""
        return self.layout.groups_per_rank()

    def destroy(self) -> None:
        for group in self._owned:
            dist.destroy_process_group(group)
        self._owned.clear()
        self._groups.clear()


def initialize_dynamic_cp_groups(layout: GroupLayout) -> DynamicCPGroups:
    """Creates the registry (collective over the whole world) and makes it current."""
    global _REGISTRY
    destroy_dynamic_cp_groups()
    _REGISTRY = DynamicCPGroups(layout)
    return _REGISTRY


def destroy_dynamic_cp_groups() -> None:
    global _REGISTRY
    if _REGISTRY is not None:
        _REGISTRY.destroy()
        _REGISTRY = None
