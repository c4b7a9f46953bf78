"""Evaluate a schedule under the cost model: per-rank times, levels, critical path."""

from __future__ import annotations

from dataclasses import dataclass

from megatron.varlen.scheduling.problem import Schedule, ScheduleProblem


def rank_times(problem: ScheduleProblem, schedule: Schedule) -> list[list[float]]:
    """Estimated time of every rank in every micro-batch.

    A rank's time is the sum of t(padded L, c) over its sequences plus its group's latency
    d*(c-1) (once per micro-batch); a rank holding nothing has time 0.
    """
    cost = problem.cost
    seq_time = [cost.time(padded, size)
                for padded, size in zip(schedule.padded_lengths, schedule.cp_sizes)]
    return [[sum(seq_time[seq] for seq in ids) + cost.group_latency(schedule.cp_sizes[ids[0]])
             if ids else 0.0 for ids in ranks] for ranks in schedule.microbatches]


def microbatch_levels(problem: ScheduleProblem, schedule: Schedule) -> list[float]:
    """Slowest rank's time of every micro-batch."""
    return list(schedule_costs(problem, schedule).levels)


def critical_path(problem: ScheduleProblem, schedule: Schedule) -> float:
    """Sum over micro-batches of the slowest rank's time."""
    return schedule_costs(problem, schedule).critical_path


@dataclass(frozen=True)
class ScheduleCosts:
    """A schedule's numbers from one pass of ``rank_times``, for whoever needs several of
    them (the training step orders micro-batches by the levels and logs the imbalance)."""

    levels: tuple[float, ...]  # per micro-batch, in schedule order
    busy_rank_time: float  # sum of every rank's time over every micro-batch

    @property
    def critical_path(self) -> float:
        return float(sum(self.levels))


def schedule_costs(problem: ScheduleProblem, schedule: Schedule) -> ScheduleCosts:
    """Levels and busy rank-time of ``schedule`` (one evaluation)."""
    times = rank_times(problem, schedule)
    return ScheduleCosts(levels=tuple(max(row, default=0.0) for row in times),
                         busy_rank_time=sum(sum(row) for row in times))
