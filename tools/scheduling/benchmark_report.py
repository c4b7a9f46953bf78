"""Markdown report of tools/benchmark_schedulers.py (plain string building, torch-free)."""

from __future__ import annotations

from tools.scheduling.benchmark import WORKLOADS

RATIO_TARGET = 1.05
LATENCY_TARGETS_MS = {64: 10.0, 1024: 200.0}
PART_B_MARKER = "<!-- PART-B: CPU training ratios (filled in by the lead) -->"


def _gain(ours: float, theirs: float) -> str:
    return f"{100.0 * (theirs - ours) / theirs:+.1f}%"


def _row_order(key: str) -> tuple[int, int]:
    """Workloads in benchmark order, then ranks ascending (JSON round trips sort keys)."""
    names = [workload.name for workload in WORKLOADS]
    workload, ranks = key.split("/")
    return names.index(workload), int(ranks)


def _has_upstream(grid: dict) -> bool:
    return any("upstream_dynamic_cp" in value["schedulers"] for value in grid.values())


def _upstream_cell(runs: dict, name: str) -> str:
    run = runs.get(name)
    if run is None:
        return "n/a"
    if "error" in run:
        return "error"
    return f"{run['ratio_latency']:.3f}"


def _grid_table(grid: dict) -> list[str]:
    upstream = _has_upstream(grid)
    header = ("| workload | ranks | LB2/LB1 | LB3/LB2 | dynamic CP /LB2 | **/LB3** | "
              "dp_balanced /LB3 | ")
    if upstream:
        header += "upstream DCP /LB3 | upstream dp_bal. /LB3 | DCP vs upstream DCP | "
    header += "DCP vs dp_balanced | DCP 1st-run CPU ms |"
    lines = [header, "|---|" + "---:|" * (header.count("|") - 2)]
    for key in sorted(grid, key=_row_order):
        value = grid[key]
        workload, ranks = key.split("/")
        runs = value["schedulers"]
        ours = runs["default_dynamic_cp"]
        cells = [workload, ranks, f"{value['budget_aware_bound'] / value['simple_bound']:.3f}",
                 f"{value['latency_aware_bound'] / value['budget_aware_bound']:.3f}",
                 f"{ours['ratio_budget']:.3f}", f"**{ours['ratio_latency']:.3f}**",
                 f"{runs['dp_balanced']['ratio_latency']:.3f}"]
        if upstream:
            cells += [_upstream_cell(runs, "upstream_dynamic_cp"),
                      _upstream_cell(runs, "upstream_dp_balanced")]
            theirs = runs.get("upstream_dynamic_cp", {})
            cells.append(_gain(ours["critical_path"], theirs["critical_path"])
                         if "critical_path" in theirs else "n/a")
        cells.append(_gain(ours["critical_path"], runs["dp_balanced"]["critical_path"]))
        cells.append(f"{ours['max_ms']:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _target_lines(results: dict) -> list[str]:
    grid = {**results["grid"], **{f"{key} (8/rank)": value
                                  for key, value in results["small_batches"].items()}}
    ratios = [value["schedulers"]["default_dynamic_cp"]["ratio_latency"]
              for value in grid.values()]
    within = sum(ratio <= RATIO_TARGET for ratio in ratios)
    never_worse = all(value["schedulers"]["default_dynamic_cp"]["critical_path"]
                      <= value["schedulers"]["dp_balanced"]["critical_path"] * (1 + 1e-9)
                      for value in grid.values())
    lines = [f"- Dynamic CP within {RATIO_TARGET}x of the latency-aware bound (LB3) in {within} "
             f"of {len(ratios)} configurations (worst {max(ratios):.3f}x, median "
             f"{sorted(ratios)[len(ratios) // 2]:.3f}x).",
             f"- Never worse than dp_balanced at the same budget: "
             f"{'yes, in every configuration' if never_worse else 'NO (see tables)'}."]
    lines += _upstream_lines(results, grid)
    for ranks, target in LATENCY_TARGETS_MS.items():
        rows = [value for key, value in results.get("target_latency", {}).items()
                if key.endswith(f"/{ranks}")]
        if rows:
            worst = max(row["cpu_ms"] for row in rows)
            lines.append(f"- Latency at {ranks} ranks ({rows[0]['num_sequences']} sequences), "
                         f"worst workload: {worst:.1f} ms CPU (target {target:.0f} ms: "
                         f"{'met' if worst <= target else 'MISSED'}); per workload below.")
    return lines


def _upstream_lines(results: dict, grid: dict) -> list[str]:
    upstream = results.get("upstream")
    if not upstream:
        return ["- Upstream: not run (no `--upstream-megatron PATH`); this report shows no "
                "upstream numbers."]
    ratios = [value["schedulers"]["default_dynamic_cp"]["critical_path"]
              / value["schedulers"]["upstream_dynamic_cp"]["critical_path"]
              for value in grid.values()
              if "critical_path" in value["schedulers"].get("upstream_dynamic_cp", {})]
    errors = sum("error" in value["schedulers"].get("upstream_dynamic_cp", {})
                 for value in grid.values())
    line = (f"- Upstream's own schedulers, Megatron-LM commit `{upstream['commit'][:12]}`, run "
            f"unmodified from a checkout on the same batches (up to 64 ranks): ")
    if ratios:
        line += (f"our critical path / upstream default_dynamic_cp's = median "
                 f"{sorted(ratios)[len(ratios) // 2]:.3f}x, range {min(ratios):.3f}x .. "
                 f"{max(ratios):.3f}x over {len(ratios)} configurations")
    if errors:
        line += f"; upstream raised an error in {errors} configurations"
    budgets = {workload.name: workload.budget for workload in WORKLOADS}
    over = [(key, run["max_rank_tokens"] / budgets[key.split("/")[0]])
            for key, value in grid.items() for name, run in value["schedulers"].items()
            if name.startswith("upstream") and run.get("max_rank_tokens", 0)
            > budgets[key.split("/")[0]]]
    budget_line = ("- Upstream's schedules, padded with our rule, stay within the per-rank token "
                   "budget in every configuration." if not over else
                   f"- Upstream's schedules, padded with our rule, exceed the per-rank token "
                   f"budget in {len(over)} scheduler-configurations (at most "
                   f"{max(ratio for _, ratio in over):.3f}x the budget): its packing counts "
                   "unpadded tokens, so its critical paths are slightly optimistic.")
    return [line + ".", budget_line]


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
    names = sorted({name for values in latency.values() for name in values
                    if name != "num_sequences"})
    lines = ["| ranks | sequences | " + " | ".join(f"{name} [ms]" for name in names) + " |",
             "|---:|---:|" + "---:|" * len(names)]
    # CPU time of the scheduling thread; "(wall)" columns include other users' load.
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
        + ". LB1 = simple bound, LB2 = budget-aware bound (>= LB1), LB3 = latency-aware bound "
        "(>= LB2: charges the group latency d and, on small batches, keeps each micro-batch's "
        "tokens with its own level; see docs/SCHEDULING.md). Ratios are summed "
        "critical path over summed bound across the batches of a row.", "",
        "Workloads:", *_workload_lines(), "",
        "## Headline", *_target_lines(results), "",
        "## Critical path over the bounds (64 sequences per rank)", *_grid_table(results["grid"]),
        "", "![ratio at 64 ranks](ratio_to_bound_64.png)",
        "![ratio at 8 ranks](ratio_to_bound_8.png)", "",
        "## Small global batches (8 sequences per rank, 64 ranks)",
        *_grid_table(results["small_batches"]), "",
        "## Attention-only cost (a=1, b=g=d=0), 64 ranks",
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
        "- Upstream columns appear only when the benchmark ran upstream's own code "
        "(`--upstream-megatron PATH`, tools/upstream_schedulers.py); its schedules are "
        "evaluated with our cost model and our padding rule (upstream pads dynamic-CP samples "
        "to 2 x DP x CP, which would only slow it). "
        "`tools/scheduling/upstream_reimplementation.py` (our "
        "re-implementation from prose, `reimpl_upstream_*` in tools/schedule_sim.py) is not "
        "reported as upstream.", ""]
    return "\n".join(parts)
