"""Markdown report of tools/benchmark_schedulers.py (plain string building, torch-free)."""

from __future__ import annotations

from megatron.varlen.scheduling.benchmark import WORKLOADS

RATIO_TARGET = 1.05
UPSTREAM_GAIN_TARGET = 0.15
UPSTREAM_QUOTED_RATIO = (1.32, 1.38)  # issue 4: upstream default_dynamic_cp vs the bound
LATENCY_TARGETS_MS = {64: 10.0, 1024: 200.0}
PART_B_MARKER = "<!-- PART-B: CPU training ratios (filled in by the lead) -->"


def _gain(ours: float, theirs: float) -> str:
    return f"{100.0 * (theirs - ours) / theirs:+.1f}%"


def _row_order(key: str) -> tuple[int, int]:
    """Workloads in benchmark order, then ranks ascending (JSON round trips sort keys)."""
    names = [workload.name for workload in WORKLOADS]
    workload, ranks = key.split("/")
    return names.index(workload), int(ranks)


def _grid_table(grid: dict) -> list[str]:
    lines = ["| workload | ranks | LB2/LB1 | dynamic CP /LB1 | /LB2 | dp_balanced /LB2 | "
             "upstream DCP /LB2 | upstream dp_bal. /LB2 | DCP vs upstream DCP | "
             "DCP vs dp_balanced | DCP 1st-run CPU ms |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for key in sorted(grid, key=_row_order):
        value = grid[key]
        workload, ranks = key.split("/")
        runs = value["schedulers"]
        ours = runs["default_dynamic_cp"]
        cells = [workload, ranks, f"{value['budget_aware_bound'] / value['simple_bound']:.3f}",
                 f"{ours['ratio_simple']:.3f}", f"**{ours['ratio_budget']:.3f}**",
                 f"{runs['dp_balanced']['ratio_budget']:.3f}"]
        for name in ("upstream_dynamic_cp", "upstream_dp_balanced"):
            cells.append(f"{runs[name]['ratio_budget']:.3f}" if name in runs else "n/a")
        upstream = runs.get("upstream_dynamic_cp")
        cells.append(_gain(ours["critical_path"], upstream["critical_path"]) if upstream else "n/a")
        cells.append(_gain(ours["critical_path"], runs["dp_balanced"]["critical_path"]))
        cells.append(f"{ours['max_ms']:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _target_lines(results: dict) -> list[str]:
    grid = {**results["grid"], **{f"{key} (8/rank)": value
                                  for key, value in results["small_batches"].items()}}
    ratios = [value["schedulers"]["default_dynamic_cp"]["ratio_budget"] for value in grid.values()]
    within = sum(ratio <= RATIO_TARGET for ratio in ratios)
    never_worse = all(value["schedulers"]["default_dynamic_cp"]["critical_path"]
                      <= value["schedulers"]["dp_balanced"]["critical_path"] * (1 + 1e-9)
                      for value in grid.values())
    gains = [(value["schedulers"]["upstream_dynamic_cp"]["critical_path"]
              - value["schedulers"]["default_dynamic_cp"]["critical_path"])
             / value["schedulers"]["upstream_dynamic_cp"]["critical_path"]
             for value in grid.values() if "upstream_dynamic_cp" in value["schedulers"]]
    lines = [f"- Dynamic CP within {RATIO_TARGET}x of the budget-aware bound in {within} of "
             f"{len(ratios)} configurations (worst {max(ratios):.3f}x, median "
             f"{sorted(ratios)[len(ratios) // 2]:.3f}x).",
             f"- Never worse than dp_balanced at the same budget: "
             f"{'yes, in every configuration' if never_worse else 'NO (see tables)'}.",
             f"- Critical path vs our upstream re-implementation: median "
             f"{100 * sorted(gains)[len(gains) // 2]:.1f}% shorter, range "
             f"{100 * min(gains):.1f}% .. {100 * max(gains):.1f}%; "
             f"{sum(gain >= UPSTREAM_GAIN_TARGET for gain in gains)} of {len(gains)} "
             f"configurations reach the {100 * UPSTREAM_GAIN_TARGET:.0f}% target. The "
             f"re-implementation is far stronger than upstream's quoted "
             f"{UPSTREAM_QUOTED_RATIO[0]}-{UPSTREAM_QUOTED_RATIO[1]}x the bound; against "
             f"that quote our worst ratio is {_gain(max(ratios), UPSTREAM_QUOTED_RATIO[0])} "
             f"and our median {_gain(sorted(ratios)[len(ratios) // 2], UPSTREAM_QUOTED_RATIO[0])}"
             f" shorter (same bound, different batches: indicative only)."]
    for ranks, target in LATENCY_TARGETS_MS.items():
        rows = [value for key, value in results.get("target_latency", {}).items()
                if key.endswith(f"/{ranks}")]
        if rows:
            worst = max(row["cpu_ms"] for row in rows)
            lines.append(f"- Latency at {ranks} ranks ({rows[0]['num_sequences']} sequences), "
                         f"worst workload: {worst:.1f} ms CPU (target {target:.0f} ms: "
                         f"{'met' if worst <= target else 'MISSED'}); per workload below.")
    return lines


def _target_latency_table(target_latency: dict) -> list[str]:
    if not target_latency:
        return []
    lines = ["| workload / ranks | sequences | CPU ms | wall ms |", "|---|---:|---:|---:|"]
    for key in sorted(target_latency, key=_row_order):
        value = target_latency[key]
        lines.append(f"| {key} | {value['num_sequences']} | {value['cpu_ms']:.1f} | "
                     f"{value['wall_ms']:.1f} |")
    return lines


def _latency_table(latency: dict) -> list[str]:
    if not latency:
        return ["(not measured in --quick mode)"]
    names = [name for name in next(iter(latency.values())) if name != "num_sequences"]
    lines = ["| ranks | sequences | " + " | ".join(f"{name} [ms]" for name in names) + " |",
             "|---:|---:|" + "---:|" * len(names)]
    # CPU time of the scheduling process; "(wall)" columns include other users' load.
    for ranks in sorted(latency, key=int):
        values = latency[ranks]
        cells = [str(ranks), str(values["num_sequences"])]
        cells += [f"{values[name]:.1f}" if name in values else "n/a" for name in names]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _pipeline_table(pipeline: dict) -> list[str]:
    lines = ["| workload / seqs per rank | micro-batches | textbook (p-1)/(m+p-1) | "
             "bubble as scheduled | bubble ordered |", "|---|---:|---:|---:|---:|"]
    for key in sorted(pipeline, key=_row_order):
        value = pipeline[key]
        lines.append(f"| {key} | {value['num_microbatches']} | "
                     f"{value['scheduled']['uniform_fraction']:.3f} | "
                     f"{value['scheduled']['bubble_fraction']:.3f} | "
                     f"{value['ordered']['bubble_fraction']:.3f} |")
    return lines


def _workload_lines() -> list[str]:
    return [f"- `{w.name}`: {w.description}; budget {w.budget} tokens/rank, static CP "
            f"{w.cp_size}." for w in WORKLOADS]


def render_report(results: dict, command: str) -> str:
    """The whole REPORT.md."""
    cost = results["default_cost"]
    parts = [
        "# Scheduler benchmark", "",
        f"Generated by `{command}` in {results['runtime_s']:.0f} s (pure Python + numpy on the "
        "project's 2-core CPU machine). Method and definitions: docs/SCHEDULING.md.", "",
        "Cost model (default everywhere): a=1, b=6h with h=4096, H100 NVLink profile: "
        + ", ".join(f"{key}={value:.4g}" for key, value in cost.items())
        + ". LB1 = simple bound, LB2 = budget-aware bound (>= LB1). Ratios are summed "
        "critical path over summed bound across the batches of a row.", "",
        "Workloads:", *_workload_lines(), "",
        "## Headline", *_target_lines(results), "",
        "## Critical path over the bounds (64 sequences per rank)", *_grid_table(results["grid"]),
        "", "![ratio at 64 ranks](ratio_to_bound_64.png)",
        "![ratio at 8 ranks](ratio_to_bound_8.png)", "",
        "## Small global batches (8 sequences per rank, 64 ranks)",
        *_grid_table(results["small_batches"]), "",
        "## Upstream's cost model (attention only: a=1, b=g=d=0), 64 ranks",
        *_grid_table(results["attention_only"]), "",
        "## Per-rank work", "![per-rank work](rank_work.png)", "",
        "## Scheduler latency (upstream_bench workload, best of several runs, CPU time; "
        "wall time in the '(wall)' columns -- the machine is shared)",
        *_latency_table(results["latency"]), "", "![latency](latency.png)", "",
        "default_dynamic_cp on every workload at the target scales (best of 9-20 runs):",
        *_target_latency_table(results.get("target_latency", {})), "",
        "The grid's '1st-run' column is one cold run per batch (first call, caches cold, "
        "shared machine); the latency numbers above are best of several runs.", "",
        "Complexity: O(n log n) for the sort plus O(n log N) heap steps for packing; "
        "bounds O(n S log n) per threshold (S = group sizes); see docs/SCHEDULING.md.", "",
        "## Pipeline bubbles (PP=4, 1F1B simulation, 64 ranks, default_dynamic_cp)",
        *_pipeline_table(results["pipeline"]), "",
        "## Part (b): CPU training ratios", PART_B_MARKER, "",
        "_To be added: measured CPU step-time ratios of dynamic CP vs dp_balanced._", "",
        "## Notes",
        "- `upstream_*` are our re-implementations from the prose in shared/RESEARCH.md, not "
        "upstream's code; they use our padding rule (upstream pads to 2N under dynamic CP, "
        "which would only slow it). Upstream's own published ratio (1.32-1.38x the bound for "
        "default_dynamic_cp) is not reproduced by this re-implementation, so the gain over "
        "upstream is measured against a stronger baseline than upstream itself.",
        "- Upstream re-implementations are not run at 1,024 ranks (their O(n N) loop takes "
        ">20 s there).", ""]
    return "\n".join(parts)
