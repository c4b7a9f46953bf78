"""Puts the latest benchmark numbers into README.md and the scheduling report's part (b).

    python tools/update_readme_tables.py   # after tools/benchmark_schedulers.py and
                                           # tools/benchmark_training.py (make bench runs all)

Reads results/scheduling/results.json and results/training/results.json; rewrites the block
between the README's scheduling-table markers and the PART-B block of
results/scheduling/REPORT.md. Numbers are only ever copied from those result files.
"""

from __future__ import annotations

if not __package__:  # run as `python tools/X.py`: the repository root on sys.path
    import _repo_root  # noqa: F401

import argparse
import json
import re
from pathlib import Path

from tools.benchmark_training import RATIOS  # the ratios the benchmark defines

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
SCHED_RESULTS = REPO / "results" / "scheduling" / "results.json"
SCHED_REPORT = REPO / "results" / "scheduling" / "REPORT.md"
TRAIN_RESULTS = REPO / "results" / "training" / "results.json"
TRAIN_REPORT = REPO / "results" / "training" / "REPORT.md"
README_BLOCK = re.compile(r"(<!-- scheduling-table:start -->\n).*?(<!-- scheduling-table:end -->)",
                          re.S)
PART_B_BLOCK = re.compile(r"(<!-- PART-B:[^\n]*-->\n).*?(\n## Notes)", re.S)
RANKS = 64
OURS = [("default_dynamic_cp", "dynamic CP (ours)"), ("dp_balanced", "dp_balanced (ours)")]
UPSTREAM = [("upstream_dynamic_cp", "upstream default_dynamic_cp"),
            ("upstream_dp_balanced", "upstream dp_balanced")]


def _cell(runs: dict, name: str) -> str:
    run = runs.get(name)
    if run is None:
        return "n/a"
    return "error" if "error" in run else f"{run['ratio_latency']:.3f}"


def scheduling_table(results: dict) -> list[str]:
    """Ours always; upstream's columns only if the benchmark ran upstream's own code."""
    grid = {key: row for key, row in results["grid"].items() if key.endswith(f"/{RANKS}")}
    upstream = results.get("upstream")
    columns = OURS + (UPSTREAM if upstream else [])
    lines = [f"Critical path / latency-aware lower bound, {RANKS} ranks, 64 sequences per rank "
             "(lower is better; 1.00 is optimal):", "",
             "| distribution | " + " | ".join(label for _, label in columns) + " |",
             "|---|" + "---:|" * len(columns)]
    for key in sorted(grid):
        cells = [_cell(grid[key]["schedulers"], name) for name, _ in columns]
        lines.append(f"| {key.split('/')[0]} | " + " | ".join(cells) + " |")
    lines.append("")
    if upstream:
        lines.append(f"Upstream columns: upstream's own schedulers, run unmodified from a "
                     f"Megatron-LM checkout (commit `{upstream['commit'][:12]}`) on the same "
                     "batches via `--upstream-megatron`, evaluated with our cost model.")
    else:
        lines.append("No upstream columns: the benchmark ran without a Megatron-LM checkout "
                     "(`--upstream-megatron PATH`).")
    lines.append("Full report, latencies and plots: "
                 "[results/scheduling/REPORT.md](results/scheduling/REPORT.md).")
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


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
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
