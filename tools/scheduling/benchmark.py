"""Reference workloads and measurement loops for tools/benchmark_schedulers.py (torch-free).

Each reference distribution comes with the per-rank budget and static CP size it is benchmarked
at (the anchor workloads: upstream's DCP benchmark and CI distributions, RL rollouts with a
spike at the length cap, Llama-3-like SFT, a Pareto tail). Global batches hold
``sequences_per_rank * N`` sequences, so the 64-rank case is 4,096 sequences and the 1,024-rank
case 65,536 (the latency targets).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from megatron.varlen.packing.length_distributions import parse_length_config
from megatron.varlen.scheduling.cost_model import CostModel
from megatron.varlen.scheduling.pipeline_order import order_for_pipeline
from megatron.varlen.scheduling.problem import ScheduleProblem
from megatron.varlen.scheduling.schedule_evaluation import microbatch_levels, rank_times
from megatron.varlen.scheduling.validate import validate_schedule
from tools.scheduling.bounds import (
    budget_aware_lower_bound,
    latency_aware_lower_bound,
    simple_lower_bound,
)
from tools.scheduling.pipeline_bubbles import pipeline_bubble_estimate
from tools.scheduling.simulate import resolve_scheduler


@dataclass(frozen=True)
class Workload:
    """A reference length distribution and the budget / static CP it runs at."""

    name: str
    description: str
    spec: dict
    budget: int
    cp_size: int


def _lognormal(low: int, high: int, sigma: float, **center: float) -> dict:
    return {"mode": "distribution", "type": "lognormal", "min_seq_len": low,
            "max_seq_len": high, "lognormal_sigma": sigma, **center}


WORKLOADS = (
    Workload("upstream_bench", "lognormal 128-8192, mean 1024, sigma 1.5 (upstream DCP bench)",
             _lognormal(128, 8192, 1.5, mean_seq_len=1024), budget=2048, cp_size=4),
    Workload("ci", "lognormal 128-2048, mean 512, sigma 1.2 (upstream CI)",
             _lognormal(128, 2048, 1.2, mean_seq_len=512), budget=1024, cp_size=2),
    Workload("rl_rollouts", "lognormal median 700, sigma 0.9, 16-8192, 10% at the 8192 cap",
             _lognormal(16, 8192, 0.9, median_seq_len=700, cap_fraction=0.1),
             budget=4096, cp_size=2),
    Workload("llama3_sft", "99.9% lognormal median 1K (sigma 0.3) + 0.1% uniform 36K-38K",
             {"mode": "distribution", "type": "mixture", "components": [
                 {"weight": 0.999, **_lognormal(128, 4096, 0.3, median_seq_len=1024)},
                 {"weight": 0.001, "type": "uniform", "min_seq_len": 36000,
                  "max_seq_len": 38000}]},
             budget=8192, cp_size=8),
    Workload("pareto_tail", "Pareto alpha 1.2, 256-32768",
             {"mode": "distribution", "type": "pareto", "min_seq_len": 256,
              "max_seq_len": 32768, "pareto_alpha": 1.2}, budget=4096, cp_size=8),
)

OUR_SCHEDULERS = ("dp_balanced", "default_dynamic_cp")
# Upstream's own schedulers, run from a checkout (tools/upstream_schedulers.py), keyed like ours.
UPSTREAM_NAMES = {"dynamic": "upstream_dynamic_cp", "dp_balanced": "upstream_dp_balanced"}


def sample_batches(workload: Workload, num_sequences: int, num_batches: int,
                   seed: int) -> list[tuple[int, ...]]:
    """``num_batches`` global batches of ``num_sequences`` lengths."""
    lengths = parse_length_config(workload.spec, seq_length=2).sample(
        num_sequences * num_batches, seed)
    return [tuple(lengths[index * num_sequences:(index + 1) * num_sequences].tolist())
            for index in range(num_batches)]


def make_problem(workload: Workload, lengths: tuple[int, ...], num_ranks: int, cost: CostModel,
                 pp_size: int = 1) -> ScheduleProblem:
    """The problem of one batch of ``workload`` on ``num_ranks`` DPxCP ranks."""
    cp = min(workload.cp_size, num_ranks)
    return ScheduleProblem(lengths=lengths, dp_size=num_ranks // cp, cp_size=cp,
                           max_seqlen_per_rank=workload.budget, min_num_microbatches=pp_size,
                           cost=cost)


def timed_schedule(problem: ScheduleProblem, scheduler: str, repeats: int = 1):
    """(schedule, best wall ms, best CPU ms) over ``repeats`` runs. CPU time is the robust
    number on a shared machine; wall time includes other users' load. It is this thread's
    time: the scheduler runs on one thread, and process time would also count OpenBLAS's idle
    worker threads, which spin for tens of milliseconds after any matrix product (the bounds
    computed just before use some), adding up to about 10 ms to a call."""
    function = resolve_scheduler(scheduler)
    best_wall, best_cpu, schedule = float("inf"), float("inf"), None
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.thread_time()
        schedule = function(problem)
        best_cpu = min(best_cpu, 1000.0 * (time.thread_time() - cpu))
        best_wall = min(best_wall, 1000.0 * (time.perf_counter() - wall))
    return schedule, best_wall, best_cpu


def evaluate_batch(problem: ScheduleProblem, schedulers: tuple[str, ...]) -> dict:
    """Bounds plus critical path and latency of each scheduler on one batch."""
    row = {"simple_bound": simple_lower_bound(problem),
           "budget_aware_bound": budget_aware_lower_bound(problem),
           "latency_aware_bound": latency_aware_lower_bound(problem), "schedulers": {}}
    for name in schedulers:
        schedule, _, elapsed = timed_schedule(problem, name)
        validate_schedule(problem, schedule)
        levels = microbatch_levels(problem, schedule)
        row["schedulers"][name] = {"critical_path": float(sum(levels)), "ms": elapsed,
                                   "num_microbatches": len(levels)}
    return row


def per_rank_work(problem: ScheduleProblem, scheduler: str) -> np.ndarray:
    """Micro-batch x rank estimated time of one scheduler's schedule (for plots)."""
    schedule = timed_schedule(problem, scheduler)[0]
    return np.asarray(rank_times(problem, schedule), dtype=np.float64)


def pipeline_study(problem: ScheduleProblem, pp_size: int) -> dict:
    """1F1B bubble of default_dynamic_cp in scheduled order vs pipeline order."""
    schedule = timed_schedule(problem, "default_dynamic_cp")[0]
    ordered = order_for_pipeline(schedule, problem, pp_size)
    before = pipeline_bubble_estimate(microbatch_levels(problem, schedule), pp_size)
    after = pipeline_bubble_estimate(microbatch_levels(problem, ordered), pp_size)
    return {"num_microbatches": schedule.num_microbatches(), "scheduled": vars(before),
            "ordered": vars(after)}
