"""Side by side: default_dynamic_cp with and without the small-batch polish (polish.py).

    python -m tools.polish_effect            # small-batch rows, instance counts, CPU time
    python -m tools.polish_effect --quick    # fewer instances and repeats

(run from the repository root; pure Python, about two minutes in full). Prints

* the benchmark's five small-batch rows (8 sequences per rank, 64 ranks, 3 batches, seed 1,
  default cost): summed critical path / summed latency-aware bound, without and with;
* over benchmark-like instances (every workload, seeds, 8-64 ranks, 4-16 sequences per rank,
  pipeline depth 1 and 4): how many schedules got shorter, longer (there should be none: every
  polish move strictly shortens the critical path) and stayed equal; every schedule validated;
* CPU time per call, best of interleaved repeats, without and with, at the small-batch rows'
  scale and at 4,096 sequences / 64 ranks (above the threshold: the same code runs).
"""

from __future__ import annotations

if not __package__:  # run as `python tools/X.py`: the repository root on sys.path
    import _repo_root  # noqa: F401

import argparse
from contextlib import contextmanager

from megatron.varlen.scheduling import polish
from megatron.varlen.scheduling.cost_model import CostModel
from megatron.varlen.scheduling.dynamic_cp import default_dynamic_cp
from megatron.varlen.scheduling.schedule_evaluation import microbatch_levels
from megatron.varlen.scheduling.validate import validate_schedule
from tools.scheduling.benchmark import WORKLOADS, make_problem, sample_batches, timed_schedule
from tools.scheduling.bounds import latency_aware_lower_bound

BENCHMARK_SEED = 1  # tools/benchmark_schedulers.py's default --seed


@contextmanager
def polish_off():
    """default_dynamic_cp as before the polish: no batch is small enough for it."""
    saved = polish.POLISH_MAX_SEQUENCES
    polish.POLISH_MAX_SEQUENCES = -1
    try:
        yield
    finally:
        polish.POLISH_MAX_SEQUENCES = saved


def critical_path(problem) -> float:
    schedule = default_dynamic_cp(problem)
    validate_schedule(problem, schedule)
    return float(sum(microbatch_levels(problem, schedule)))


def small_batch_rows() -> None:
    print("small-batch rows (64 ranks, 8 sequences per rank, 3 batches): ours / LB3")
    for workload in WORKLOADS:
        problems = [make_problem(workload, batch, 64, CostModel())
                    for batch in sample_batches(workload, 8 * 64, 3, BENCHMARK_SEED)]
        bound = sum(latency_aware_lower_bound(problem) for problem in problems)
        with polish_off():
            before = sum(critical_path(problem) for problem in problems)
        after = sum(critical_path(problem) for problem in problems)
        print(f"  {workload.name:15s} {before / bound:.4f} -> {after / bound:.4f}")


def instance_counts(seeds: range) -> None:
    better = worse = equal = 0
    largest_gain = 0.0
    for seed in seeds:
        for workload in WORKLOADS:
            for num_ranks in (8, 16, 32, 64):
                for per_rank in (4, 8, 12, 16):
                    (batch,) = sample_batches(workload, per_rank * num_ranks, 1, 100 + seed)
                    for pp_size in (1, 4):
                        problem = make_problem(workload, batch, num_ranks, CostModel(),
                                               pp_size=pp_size)
                        with polish_off():
                            before = critical_path(problem)
                        after = critical_path(problem)
                        better += after < before
                        worse += after > before
                        equal += after == before
                        largest_gain = max(largest_gain, 1.0 - after / before)
    total = better + worse + equal
    print(f"{total} benchmark-like instances: {better} shorter, {worse} longer, {equal} equal "
          f"(largest gain {100 * largest_gain:.2f}%)")


def cpu_ms(problem, repeats: int) -> tuple[float, float]:
    """Best CPU ms without and with the polish, interleaved (the benchmark's own timer)."""
    off, on = float("inf"), float("inf")
    for _ in range(repeats):
        with polish_off():
            off = min(off, timed_schedule(problem, "default_dynamic_cp")[2])
        on = min(on, timed_schedule(problem, "default_dynamic_cp")[2])
    return off, on


def timings(repeats: int) -> None:
    print(f"CPU ms per call, best of {repeats} interleaved: without -> with")
    for per_rank in (8, 64):
        for workload in WORKLOADS:
            (batch,) = sample_batches(workload, per_rank * 64, 1, BENCHMARK_SEED)
            off, on = cpu_ms(make_problem(workload, batch, 64, CostModel()), repeats)
            print(f"  {per_rank * 64:5d} sequences / 64 ranks {workload.name:15s} "
                  f"{off:6.2f} -> {on:6.2f} ({on / off:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    small_batch_rows()
    instance_counts(range(1) if args.quick else range(3))
    timings(3 if args.quick else 9)


if __name__ == "__main__":
    main()
