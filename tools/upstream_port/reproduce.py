"""The benchmark inside the patched tree: the series' scheduler, called through upstream's
interface (LptDynamicCPScheduler.get_groups_and_subsamples, imported from the patched files
by tools/upstream_schedulers.py's worker), on the benchmark's own batches, evaluated like
upstream's schedules; its critical paths against the report's ``default_dynamic_cp`` column.

Equal means equal at the report's precision (the ratio to the bound, 3 decimals); the exact
relative difference is kept too. It is not zero only where our schedule leaves a rank idle
(upstream's data path needs every rank busy, fill_idle.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tools.scheduling.benchmark import WORKLOADS, make_problem, sample_batches
from tools.upstream_port.benchmark_rows import BENCHMARK_SEED, Row, compared_rows
from tools.upstream_schedulers import evaluate_upstream, run_upstream

REPORT_DIGITS = 3  # the report prints critical path / bound with three decimals


@dataclass(frozen=True)
class Reproduction:
    """One row: the report's critical path and the patched tree's, both over the bound."""

    row: Row
    patched: float

    @property
    def report_ratio(self) -> str:
        return f"{self.row.ours / self.row.bound:.{REPORT_DIGITS}f}"

    @property
    def patched_ratio(self) -> str:
        return f"{self.patched / self.row.bound:.{REPORT_DIGITS}f}"

    @property
    def equal(self) -> bool:
        return self.report_ratio == self.patched_ratio

    @property
    def relative_difference(self) -> float:
        return self.patched / self.row.ours - 1.0


def _problems(row: Row, results: dict) -> list:
    workload = next(workload for workload in WORKLOADS if workload.name == row.workload)
    batches = sample_batches(workload, row.num_sequences(), row.num_batches(), BENCHMARK_SEED)
    return [make_problem(workload, batch, row.ranks, row.cost(results)) for batch in batches]


def reproduce(patched_tree: Path, results: dict) -> list[Reproduction]:
    """Every compared row of ``results`` re-run in ``patched_tree`` (one worker process)."""
    rows = compared_rows(results)
    problems = [_problems(row, results) for row in rows]
    jobs = [{"scheduler": "lpt", "lengths": list(problem.lengths), "dp_size": problem.dp_size,
             "cp_size": problem.cp_size, "budget": problem.max_seqlen_per_rank,
             "min_cp_size": problem.min_cp_size, "cost": problem.cost.as_dict()}
            for batch in problems for problem in batch]
    answers = iter(run_upstream(str(patched_tree), jobs))
    out = []
    for row, batch in zip(rows, problems):
        path = 0.0
        for problem in batch:
            answer = next(answers)
            if "error" in answer:
                raise RuntimeError(f"{row.label}: the patched scheduler failed: "
                                   f"{answer['error']}")
            path += evaluate_upstream(answer["microbatches"], list(problem.lengths),
                                      problem.cost, problem.sp_factor)["critical_path"]
        out.append(Reproduction(row, path))
    return out
