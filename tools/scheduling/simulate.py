"""Simulator core shared by tools/schedule_sim.py and tools/benchmark_schedulers.py.

Forms global batches from a stream of lengths (in order, clipped to max_seq_len), schedules each
with a named scheduler, times it, and reports the schedule and its numbers in the JSON layout of
``tools/schedule_sim.py --json``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from megatron.varlen.scheduling.cost_model import CostModel
from megatron.varlen.scheduling.pipeline_order import order_for_pipeline
from megatron.varlen.scheduling.problem import Schedule, ScheduleProblem
from megatron.varlen.scheduling.registry import get_scheduler
from megatron.varlen.scheduling.schedule_evaluation import microbatch_levels
from megatron.varlen.scheduling.validate import validate_schedule
from tools.scheduling.bounds import (
    budget_aware_lower_bound,
    latency_aware_lower_bound,
    simple_lower_bound,
)
from tools.scheduling.pipeline_bubbles import pipeline_bubble_estimate
from tools.scheduling.schedule_summary import schedule_summary
from tools.scheduling.upstream_reimplementation import (
    reimpl_upstream_dp_balanced,
    reimpl_upstream_dynamic_cp,
)

# Baselines besides the registry (not usable for training): our re-implementations of
# upstream's algorithms from their prose description -- not upstream's code, hence the names.
# Upstream's real schedulers: tools/benchmark_schedulers.py --upstream-megatron PATH.
REFERENCE_SCHEDULERS: dict[str, Callable[[ScheduleProblem], Schedule]] = {
    "reimpl_upstream_dp_balanced": reimpl_upstream_dp_balanced,
    "reimpl_upstream_dynamic_cp": reimpl_upstream_dynamic_cp,
}


@dataclass(frozen=True)
class SimConfig:
    """Everything but the lengths that defines a simulated run.

    Attributes mirror the flags of tools/schedule_sim.py.
    """

    dp_size: int
    cp_size: int
    max_seqlen_per_rank: int
    global_batch_size: int
    max_seq_len: int
    scheduler: str = "default_dynamic_cp"
    min_cp_size: int = 1
    sp_factor: int = 1
    pp_size: int = 1
    vpp_group_size: int = 1
    cost: CostModel = field(default_factory=CostModel)

    def __post_init__(self) -> None:
        if self.global_batch_size < 1:
            raise ValueError(f"global batch size {self.global_batch_size} must be >= 1 "
                             "(check --global-batch-size)")
        if self.max_seq_len < 1:
            raise ValueError(f"max_seq_len {self.max_seq_len} must be >= 1 (check --max-seq-len)")


def resolve_scheduler(name: str) -> Callable[[ScheduleProblem], Schedule]:
    """A registry scheduler or one of the upstream reference baselines."""
    if name in REFERENCE_SCHEDULERS:
        return REFERENCE_SCHEDULERS[name]
    return get_scheduler(name)


def split_batches(lengths: np.ndarray, config: SimConfig,
                  num_batches: int | None = None) -> list[tuple[int, ...]]:
    """Global batches of ``global_batch_size`` lengths in order, clipped to max_seq_len; a
    short tail is dropped unless it is the only batch."""
    clipped = np.minimum(np.asarray(lengths, dtype=np.int64), config.max_seq_len)
    size = config.global_batch_size
    count = max(1, len(clipped) // size) if len(clipped) else 0
    if num_batches is not None:
        count = min(count, num_batches)
    return [tuple(clipped[index * size:(index + 1) * size].tolist()) for index in range(count)]


def build_problem(lengths: tuple[int, ...], config: SimConfig) -> ScheduleProblem:
    """The ScheduleProblem of one global batch."""
    return ScheduleProblem(
        lengths=lengths, dp_size=config.dp_size, cp_size=config.cp_size,
        max_seqlen_per_rank=config.max_seqlen_per_rank, min_cp_size=config.min_cp_size,
        sp_factor=config.sp_factor, vpp_group_size=config.vpp_group_size,
        min_num_microbatches=config.pp_size, cost=config.cost)


def run_batch(problem: ScheduleProblem, scheduler: str, with_bounds: bool = True,
              pp_size: int = 1, validate: bool = True) -> dict:
    """Schedules one batch; returns the per-batch JSON record (schedule, timing, numbers)."""
    function = resolve_scheduler(scheduler)
    start = time.perf_counter()
    schedule = function(problem)
    elapsed_ms = 1000.0 * (time.perf_counter() - start)
    if pp_size > 1:
        schedule = order_for_pipeline(schedule, problem, pp_size)
    if validate and scheduler not in REFERENCE_SCHEDULERS:
        validate_schedule(problem, schedule)
    summary = schedule_summary(problem, schedule)
    record = {
        "lengths": list(problem.lengths),
        "padded_lengths": list(schedule.padded_lengths),
        "microbatches": [[list(ids) for ids in ranks] for ranks in schedule.microbatches],
        "scheduler_ms": elapsed_ms,
        "critical_path": summary["critical_path"],
        "summary": summary,
    }
    if with_bounds:
        record["simple_bound"] = simple_lower_bound(problem)
        record["budget_aware_bound"] = budget_aware_lower_bound(problem)
        record["latency_aware_bound"] = latency_aware_lower_bound(problem)
    if pp_size > 1:
        levels = microbatch_levels(problem, schedule)
        record["pipeline"] = vars(pipeline_bubble_estimate(levels, pp_size))
    return record


def summarize_run(records: list[dict]) -> dict:
    """Aggregate numbers over the batches of a run."""
    paths = [record["critical_path"] for record in records]
    out = {
        "num_global_batches": len(records),
        "total_critical_path": float(sum(paths)),
        "mean_scheduler_ms": (float(np.mean([r["scheduler_ms"] for r in records]))
                              if records else 0.0),
        "max_scheduler_ms": float(max((r["scheduler_ms"] for r in records), default=0.0)),
        "mean_efficiency": float(np.mean([r["summary"]["efficiency"] for r in records]))
        if records else 0.0,
        "mean_num_microbatches": float(np.mean([r["summary"]["num_microbatches"]
                                                for r in records])) if records else 0.0,
    }
    if records and "simple_bound" in records[0]:
        simple = sum(record["simple_bound"] for record in records)
        budget = sum(record["budget_aware_bound"] for record in records)
        latency = sum(record["latency_aware_bound"] for record in records)
        out["total_simple_bound"] = float(simple)
        out["total_budget_aware_bound"] = float(budget)
        out["total_latency_aware_bound"] = float(latency)
        out["ratio_to_simple_bound"] = float(sum(paths) / simple) if simple else 1.0
        out["ratio_to_budget_aware_bound"] = float(sum(paths) / budget) if budget else 1.0
        out["ratio_to_latency_aware_bound"] = float(sum(paths) / latency) if latency else 1.0
    return out


def simulate(lengths: np.ndarray, config: SimConfig, num_batches: int | None = None,
             with_bounds: bool = True) -> dict:
    """Runs ``config.scheduler`` over the global batches of ``lengths``; JSON-ready result."""
    records = [run_batch(build_problem(batch, config), config.scheduler, with_bounds,
                         config.pp_size)
               for batch in split_batches(lengths, config, num_batches)]
    return {
        "dp_size": config.dp_size,
        "cp_size": config.cp_size,
        "max_seqlen_per_dp_cp_rank": config.max_seqlen_per_rank,
        "scheduler": config.scheduler,
        "cost": config.cost.as_dict(),
        "global_batches": records,
        "summary": summarize_run(records),
    }
