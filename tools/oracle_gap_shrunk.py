"""Splits a benchmark row's gap to the latency-aware bound into schedule and bound parts.

The benchmark's rows are too large for the exact oracle, so this shrinks a workload to a few
sequences on a few ranks (same length distribution, budget, static CP and cost model) and
reports, over many such instances, ours / optimum (the scheduler's own gap) and optimum /
latency-aware bound (how loose the bound is there: no schedule can beat the optimum).

    python -m tools.oracle_gap_shrunk --workload pareto_tail --ranks 8 --sequences 8

(run from the repository root; pure Python, about half a second per 8-sequence instance).
"""

from __future__ import annotations

if not __package__:  # run as `python tools/X.py`: the repository root on sys.path
    import _repo_root  # noqa: F401

import argparse
import statistics

from megatron.varlen.scheduling.cost_model import CostModel
from megatron.varlen.scheduling.dynamic_cp import default_dynamic_cp
from megatron.varlen.scheduling.problem import ScheduleProblem
from megatron.varlen.scheduling.schedule_evaluation import microbatch_levels
from tools.schedule_oracle import solve_exactly
from tools.scheduling.benchmark import WORKLOADS, sample_batches
from tools.scheduling.bounds import latency_aware_lower_bound

MAX_ORACLE_SEQUENCES = 10  # the oracle is O(3^n): about a second per instance at n = 10


def _summary(values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return f"median {statistics.median(ordered):.3f}, p90 {p90:.3f}, max {ordered[-1]:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="pareto_tail",
                        choices=[workload.name for workload in WORKLOADS])
    parser.add_argument("--ranks", type=int, default=8, help="DPxCP ranks (<= 8 for the oracle)")
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--instances", type=int, default=40)
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args()
    if not 1 <= args.sequences <= MAX_ORACLE_SEQUENCES:
        parser.error(f"--sequences {args.sequences} must be in [1, {MAX_ORACLE_SEQUENCES}]")
    workload = next(item for item in WORKLOADS if item.name == args.workload)
    cp_size = min(workload.cp_size, args.ranks)
    ours_to_opt, opt_to_bound = [], []
    for lengths in sample_batches(workload, args.sequences, args.instances, args.seed):
        problem = ScheduleProblem(lengths=lengths, dp_size=args.ranks // cp_size,
                                  cp_size=cp_size, max_seqlen_per_rank=workload.budget,
                                  cost=CostModel())
        optimum = solve_exactly(problem).critical_path
        ours = sum(microbatch_levels(problem, default_dynamic_cp(problem)))
        ours_to_opt.append(ours / optimum)
        opt_to_bound.append(optimum / latency_aware_lower_bound(problem))
    print(f"{workload.name} lengths, {args.sequences} sequences on {args.ranks} ranks "
          f"(static CP {cp_size}, budget {workload.budget}), {args.instances} instances:")
    print(f"  ours / optimum:                {_summary(ours_to_opt)}")
    print(f"  optimum / latency-aware bound: {_summary(opt_to_bound)}")


if __name__ == "__main__":
    main()
