"""``--thd-max-packed-sequences``: at most K sequences per rank in every micro-batch.

Applied to any scheduler's answer (pure, deterministic, torch-free): a micro-batch in which a
rank holds more than K sequences becomes several micro-batches, part j taking sequences
``j*K .. (j+1)*K - 1`` of every rank's list. A CP group's ranks hold the same list, so each part
keeps the group's ranks and size, every sequence stays exactly once, and no rank's token
budget can grow. If the split breaks the virtual-pipeline multiple, further micro-batches are
halved (largest lists first) until the count is a multiple again. Megatron-LM caps only its
``dp_balanced`` scheduler (``default_dynamic_cp`` fails later, when the pack is padded); here
every scheduler's schedule holds the cap.
"""

from __future__ import annotations

import dataclasses

from megatron.varlen.scheduling.counts import target_microbatch_count
from megatron.varlen.scheduling.problem import Schedule, ScheduleProblem

Microbatch = tuple[tuple[int, ...], ...]  # per DP x CP rank, the ids it runs


def _split(microbatch: Microbatch, cap: int) -> list[Microbatch]:
    """``microbatch`` as parts in which no rank holds more than ``cap`` ids."""
    parts = max(1, max(-(-len(ids) // cap) for ids in microbatch))
    return [tuple(ids[j * cap:(j + 1) * cap] for ids in microbatch) for j in range(parts)]


def _groups(microbatch: Microbatch) -> list[tuple[int, ...]]:
    """The distinct non-empty id lists (one per CP group), in rank order."""
    groups = []
    for ids in microbatch:
        if ids and (not groups or groups[-1] != ids):
            groups.append(ids)
    return groups


def _halve(microbatch: Microbatch) -> list[Microbatch]:
    """Two micro-batches from one: every rank's list split in halves, or (every list holding
    one id) the groups split in halves."""
    if max(len(ids) for ids in microbatch) > 1:
        halves = [(ids[: -(-len(ids) // 2)], ids[-(-len(ids) // 2):]) for ids in microbatch]
        return [tuple(half[0] for half in halves), tuple(half[1] for half in halves)]
    groups = _groups(microbatch)
    first = set(groups[: -(-len(groups) // 2)])
    return [tuple(ids if ids in first else () for ids in microbatch),
            tuple(() if ids in first else ids for ids in microbatch)]


def _splittable(microbatch: Microbatch) -> tuple[int, int]:
    """How much a micro-batch holds (longest rank list, groups): the largest is halved first."""
    return max(len(ids) for ids in microbatch), len(_groups(microbatch))


def _restore_multiple(microbatches: list[Microbatch], problem: ScheduleProblem) -> None:
    """Halves micro-batches (in place) until their count is a multiple of the VPP group."""
    multiple = problem.vpp_group_size
    while len(microbatches) % multiple:
        sizes = [_splittable(mb) for mb in microbatches]
        index = max(range(len(microbatches)), key=lambda i: (sizes[i], -i))
        if sizes[index] <= (1, 1):  # one sequence per micro-batch: pad with empty ones
            nonempty = sum(1 for mb in microbatches if any(mb))
            wanted = target_microbatch_count(nonempty, problem.num_sequences,
                                             problem.min_num_microbatches, multiple)
            empty = tuple(() for _ in range(problem.num_ranks))
            microbatches.extend([empty] * (wanted - len(microbatches)))
            return
        microbatches[index:index + 1] = _halve(microbatches[index])


def cap_sequences_per_rank(schedule: Schedule, problem: ScheduleProblem,
                           cap: int | None) -> Schedule:
    """``schedule`` with at most ``cap`` sequence ids per rank per micro-batch (None: as is)."""
    if cap is None:
        return schedule
    microbatches = [part for mb in schedule.microbatches for part in _split(mb, cap)]
    if len(microbatches) == schedule.num_microbatches():
        return schedule
    _restore_multiple(microbatches, problem)
    return dataclasses.replace(schedule, microbatches=tuple(microbatches))
