"""The benchmark's upstream comparison, row by row, read from results/scheduling/results.json.

A row is one configuration where upstream's own default_dynamic_cp ran on the same batches as
ours (tools/benchmark_schedulers.py --upstream-megatron): its section, workload and ranks, both
critical paths (summed over the row's batches), the latency-aware bound, and the most padded
tokens any upstream rank held. Enough to regenerate those batches: the section fixes the
sequences per rank and the cost model (the grid's cost is stored in the results).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from megatron.varlen.scheduling.cost_model import CostModel
from tools.benchmark_schedulers import (
    ATTENTION_ONLY,
    BATCHES_AT_SCALE,
    SEQUENCES_PER_RANK,
    SMALL_BATCH_SEQUENCES_PER_RANK,
)
from tools.scheduling.benchmark import WORKLOADS

RESULTS = Path(__file__).resolve().parents[2] / "results" / "scheduling" / "results.json"
SECTIONS = {"grid": SEQUENCES_PER_RANK, "small_batches": SMALL_BATCH_SEQUENCES_PER_RANK,
            "attention_only": SEQUENCES_PER_RANK}
OURS, THEIRS = "default_dynamic_cp", "upstream_dynamic_cp"
BENCHMARK_SEED = 1  # tools/benchmark_schedulers.py's default --seed, which the report used


@dataclass(frozen=True)
class Row:
    """One configuration of the comparison (critical paths summed over its batches)."""

    section: str
    workload: str
    ranks: int
    ours: float
    theirs: float
    bound: float
    their_max_tokens: int
    budget: int

    @property
    def label(self) -> str:
        return f"{self.workload}/{self.ranks} ({SECTIONS[self.section]}/rank"\
               f"{', attention-only cost' if self.section == 'attention_only' else ''})"

    def cost(self, results: dict) -> CostModel:
        """The cost model the row's critical paths were measured with."""
        if self.section == "attention_only":
            return ATTENTION_ONLY
        return CostModel(**results["default_cost"])

    def num_batches(self) -> int:
        return BATCHES_AT_SCALE[self.ranks]

    def num_sequences(self) -> int:
        return SECTIONS[self.section] * self.ranks


def load_results(path: Path = RESULTS) -> dict:
    """The benchmark's results; ValueError (one line) if it has no upstream comparison."""
    try:
        results = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ValueError(f"--results {path}: cannot read ({error})") from None
    if not results.get("upstream") or not compared_rows(results):
        raise ValueError(f"--results {path}: no upstream comparison (run make bench "
                         "UPSTREAM_MEGATRON=PATH first)")
    return results


def compared_rows(results: dict) -> list[Row]:
    """Every configuration where upstream's default_dynamic_cp ran, in report order."""
    budgets = {workload.name: workload.budget for workload in WORKLOADS}
    order = [workload.name for workload in WORKLOADS]
    rows = []
    for section in SECTIONS:
        for key, value in results.get(section, {}).items():
            runs = value["schedulers"]
            if "critical_path" not in runs.get(THEIRS, {}):
                continue
            workload, ranks = key.split("/")
            rows.append(Row(section, workload, int(ranks), runs[OURS]["critical_path"],
                            runs[THEIRS]["critical_path"], value["latency_aware_bound"],
                            runs[THEIRS].get("max_rank_tokens", 0), budgets[workload]))
    return sorted(rows, key=lambda row: (list(SECTIONS).index(row.section),
                                         order.index(row.workload), row.ranks))
