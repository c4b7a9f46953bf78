"""Puts the latest benchmark numbers into README.md and the scheduling report's part (b).

    python tools/update_readme_tables.py   # after tools/benchmark_schedulers.py and
                                           # tools/benchmark_training.py (make bench runs all)

Reads results/scheduling/results.json and results/training/results.json; rewrites the block
between the README's scheduling-table markers and the PART-B block of
results/scheduling/REPORT.md. Numbers are only ever copied from those result files.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tools.benchmark_training import RATIOS  # noqa: E402  (the ratios the benchmark defines)

README = REPO / "README.md"
SCHED_RESULTS = REPO / "results" / "scheduling" / "results.json"
SCHED_REPORT = REPO / "results" / "scheduling" / "REPORT.md"
TRAIN_RESULTS = REPO / "results" / "training" / "results.json"
TRAIN_REPORT = REPO / "results" / "training" / "REPORT.md"
README_BLOCK = re.compile(r"(<!-- scheduling-table:start -->\n).*?(<!-- scheduling-table:end -->)",
                          re.S)
PART_B_BLOCK = re.compile(r"(<!-- PART-B:[^\n]*-->\n).*?(\n## Notes)", re.S)
RANKS = 64
SCHEDULERS = [("default_dynamic_cp", "dynamic CP (ours)"), ("dp_balanced", "dp_balanced (ours)"),
              ("upstream_dynamic_cp", "upstream dynamic CP*"),
              ("upstream_dp_balanced", "upstream dp_balanced*")]


def scheduling_table(results: dict) -> list[str]:
    grid = {key: row for key, row in results["grid"].items() if key.endswith(f"/{RANKS}")}
    lines = [f"Critical path / budget-aware lower bound, {RANKS} ranks, 64 sequences per rank "
             "(lower is better; 1.00 is optimal):", "",
             "| distribution | " + " | ".join(label for _, label in SCHEDULERS) + " |",
             "|---|" + "---:|" * len(SCHEDULERS)]
    for key in sorted(grid):
        cells = [f"{grid[key]['schedulers'][name]['ratio_budget']:.3f}"
                 if name in grid[key]["schedulers"] else "n/a" for name, _ in SCHEDULERS]
        lines.append(f"| {key.split('/')[0]} | " + " | ".join(cells) + " |")
    lines += ["", "\\* our re-implementations of upstream's algorithms from their description "
              "(no upstream code); stronger than upstream's published 1.32-1.38x. Full report, "
              "latencies and plots: [results/scheduling/REPORT.md](results/scheduling/REPORT.md)."]
    return lines


def training_table(results: dict, report_link: str) -> list[str]:
    lines = ["Measured CPU training throughput ratios (real tokens/s, side by side in one run, "
             f"`python tools/benchmark_training.py`; details in [{report_link}]({report_link})):",
             "",
             "| ratio | value |", "|---|---|"]
    for label, top, bottom in RATIOS:
        ratio = results[top]["tokens_per_s"] / results[bottom]["tokens_per_s"]
        lines.append(f"| {label} | {ratio:.2f}x |")
    return lines


def main() -> None:
    sched = json.loads(SCHED_RESULTS.read_text())
    train = json.loads(TRAIN_RESULTS.read_text())
    block = "\n".join(scheduling_table(sched) + [""]
                      + training_table(train, "results/training/REPORT.md")) + "\n"
    readme = README.read_text()
    assert README_BLOCK.search(readme), "README.md lost its scheduling-table markers"
    README.write_text(README_BLOCK.sub(lambda m: m.group(1) + block + m.group(2), readme))
    report = SCHED_REPORT.read_text()
    part_b = "\n".join(training_table(train, "../training/REPORT.md")) + "\n\n" \
        + TRAIN_REPORT.read_text()
    if PART_B_BLOCK.search(report):
        SCHED_REPORT.write_text(PART_B_BLOCK.sub(
            lambda m: m.group(1) + "\n" + part_b + m.group(2), report))


if __name__ == "__main__":
    main()
