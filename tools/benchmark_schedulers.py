#!/usr/bin/env python
"""Benchmark the sequence-packing schedulers against each other and the lower bounds.

    python tools/benchmark_schedulers.py --out results/scheduling

Writes results.json, PNG plots and REPORT.md into --out. Part (a): simulator core over the
reference distributions and scales; part (c): the report. Part (b) (CPU training ratios) is a
marked placeholder section in the report, to be filled by the training benchmark.

    python tools/benchmark_schedulers.py --out results/scheduling \
        --upstream-megatron /path/to/Megatron-LM     # also run upstream's own schedulers

With --upstream-megatron, upstream's dp_balanced and default_dynamic_cp are imported from that
checkout (tools/upstream_schedulers.py: a worker process, documented import stubs, nothing
copied) and run on the same batches at up to UPSTREAM_MAX_RANKS ranks; their schedules are
evaluated with our cost model. Without it the report has no upstream columns.
"""

from __future__ import annotations

if not __package__:  # run as `python tools/X.py`: the repository root on sys.path
    import _repo_root  # noqa: F401

import argparse
import json
import os
import sys
import time

from megatron.varlen.scheduling.cost_model import DEFAULT_HIDDEN_SIZE, CostModel
from tools.scheduling.benchmark import (
    OUR_SCHEDULERS,
    UPSTREAM_NAMES,
    WORKLOADS,
    evaluate_batch,
    make_problem,
    per_rank_work,
    pipeline_study,
    sample_batches,
    timed_schedule,
)
from tools.scheduling.benchmark_report import render_report
from tools.upstream_schedulers import (
    check_checkout,
    evaluate_upstream,
    run_upstream,
    upstream_commit,
)

SCALES = (8, 64, 256, 1024)
SEQUENCES_PER_RANK = 64
SMALL_BATCH_SEQUENCES_PER_RANK = 8
BATCHES_AT_SCALE = {8: 3, 64: 3, 256: 1, 1024: 1}
UPSTREAM_MAX_RANKS = 64  # upstream's pure-Python scheduler takes seconds per batch at 64 ranks
LATENCY_REPEATS = {8: 20, 64: 20, 256: 9, 1024: 9}
TARGET_SCALES = (64, 1024)
PIPELINE_STAGES = 4
ATTENTION_ONLY = CostModel(a=1.0, b=0.0, g=0.0, d=0.0)  # upstream's L^2/c cost model


def _aggregate(rows: list[dict]) -> dict:
    """Sums over batches: critical path of each scheduler and the bounds, ratios."""
    simple = sum(row["simple_bound"] for row in rows)
    budget = sum(row["budget_aware_bound"] for row in rows)
    latency = sum(row["latency_aware_bound"] for row in rows)
    out = {"simple_bound": simple, "budget_aware_bound": budget, "latency_aware_bound": latency,
           "schedulers": {}}
    for name in rows[0]["schedulers"]:
        runs = [row["schedulers"][name] for row in rows]
        if any("error" in run for run in runs):
            out["schedulers"][name] = {"error": next(run["error"] for run in runs
                                                     if "error" in run)}
            continue
        path = sum(run["critical_path"] for run in runs)
        out["schedulers"][name] = {
            "critical_path": path, "ratio_simple": path / simple, "ratio_budget": path / budget,
            "ratio_latency": path / latency, "max_ms": max(run["ms"] for run in runs),
            "num_microbatches": sum(run["num_microbatches"] for run in runs) / len(rows)}
        if "max_rank_tokens" in runs[0]:
            out["schedulers"][name]["max_rank_tokens"] = max(run["max_rank_tokens"]
                                                             for run in runs)
    return out


def upstream_rows(upstream: str | None, problems: list, repeats: int = 1) -> list[dict]:
    """Upstream's two schedulers on ``problems`` (one worker process): per problem, name ->
    {"critical_path", "ms", "num_microbatches", "max_rank_tokens"} or {"error"}."""
    if upstream is None:
        return [{} for _ in problems]
    jobs = [{"scheduler": kind, "lengths": list(problem.lengths), "dp_size": problem.dp_size,
             "cp_size": problem.cp_size, "budget": problem.max_seqlen_per_rank,
             "min_cp_size": problem.min_cp_size, "repeats": repeats}
            for problem in problems for kind in UPSTREAM_NAMES]
    results = iter(run_upstream(upstream, jobs))
    rows = []
    for problem in problems:
        row = {}
        for kind, name in UPSTREAM_NAMES.items():
            result = next(results)
            if "error" in result:
                row[name] = {"error": result["error"]}
                continue
            row[name] = {"ms": result["ms"], **evaluate_upstream(
                result["microbatches"], list(problem.lengths), problem.cost, problem.sp_factor)}
        rows.append(row)
    return rows


def run_grid(cost: CostModel, scales: tuple[int, ...], per_rank: int, seed: int,
             log: callable, upstream: str | None = None) -> dict:
    """Every workload x scale: aggregated numbers of every scheduler."""
    results = {}
    for workload in WORKLOADS:
        for num_ranks in scales:
            batches = sample_batches(workload, per_rank * num_ranks,
                                     BATCHES_AT_SCALE[num_ranks], seed)
            problems = [make_problem(workload, batch, num_ranks, cost) for batch in batches]
            rows = [evaluate_batch(problem, OUR_SCHEDULERS) for problem in problems]
            theirs = upstream_rows(upstream if num_ranks <= UPSTREAM_MAX_RANKS else None,
                                   problems)
            for row, extra in zip(rows, theirs):
                row["schedulers"].update(extra)
            results[f"{workload.name}/{num_ranks}"] = _aggregate(rows)
            log(f"{workload.name:>15} N={num_ranks:<5} " + " ".join(
                f"{name}={value.get('ratio_latency', float('nan')):.3f}"
                for name, value in results[f"{workload.name}/{num_ranks}"]["schedulers"].items()))
    return results


def run_latency(cost: CostModel, seed: int, log: callable, upstream: str | None = None) -> dict:
    """Best-of-k CPU time per scheduler and scale on the upstream benchmark workload (upstream's
    schedulers: best-of-3 wall time in their worker process, up to UPSTREAM_MAX_RANKS)."""
    workload, out = WORKLOADS[0], {}
    for num_ranks in SCALES:
        (batch,) = sample_batches(workload, SEQUENCES_PER_RANK * num_ranks, 1, seed)
        problem = make_problem(workload, batch, num_ranks, cost)
        out[num_ranks] = {"num_sequences": len(batch)}
        for name in OUR_SCHEDULERS:
            _, wall, cpu = timed_schedule(problem, name, LATENCY_REPEATS[num_ranks])
            out[num_ranks][name] = cpu
            out[num_ranks][f"{name} (wall)"] = wall
        if num_ranks <= UPSTREAM_MAX_RANKS:
            for name, run in upstream_rows(upstream, [problem], repeats=3)[0].items():
                if "ms" in run:
                    out[num_ranks][f"{name} (wall)"] = run["ms"]
        log(f"latency N={num_ranks}: " + ", ".join(f"{k}={v:.1f}"
                                                   for k, v in out[num_ranks].items()))
    return out


def run_target_latency(cost: CostModel, seed: int, log: callable) -> dict:
    """default_dynamic_cp CPU time on every workload at the two target scales."""
    out = {}
    for num_ranks in TARGET_SCALES:
        for workload in WORKLOADS:
            (batch,) = sample_batches(workload, SEQUENCES_PER_RANK * num_ranks, 1, seed)
            problem = make_problem(workload, batch, num_ranks, cost)
            _, wall, cpu = timed_schedule(problem, "default_dynamic_cp",
                                          LATENCY_REPEATS[num_ranks])
            out[f"{workload.name}/{num_ranks}"] = {"cpu_ms": cpu, "wall_ms": wall,
                                                   "num_sequences": len(batch)}
            log(f"target latency {workload.name} N={num_ranks}: {cpu:.1f} ms CPU")
    return out


def run_pipeline(cost: CostModel, seed: int) -> dict:
    """Bubble of scheduled vs pipeline-ordered micro-batches, PP=4, small and large batches."""
    out = {}
    for workload in WORKLOADS:
        for per_rank in (SMALL_BATCH_SEQUENCES_PER_RANK, SEQUENCES_PER_RANK):
            (batch,) = sample_batches(workload, per_rank * 64, 1, seed)
            problem = make_problem(workload, batch, 64, cost, pp_size=PIPELINE_STAGES)
            out[f"{workload.name}/{per_rank}"] = pipeline_study(problem, PIPELINE_STAGES)
    return out


def _plot_rank_work(plt, work: dict, out_dir: str) -> None:
    """Per-rank estimated time in every micro-batch, one panel per scheduler."""
    figure, axes = plt.subplots(1, len(work), figsize=(5 * len(work), 4), sharey=True)
    for axis, (name, times) in zip(axes, work.items()):
        image = axis.imshow(times, aspect="auto", cmap="viridis", interpolation="nearest")
        axis.set_title(f"{name}\ncritical path {times.max(axis=1).sum():.3g}")
        axis.set_xlabel("DPxCP rank")
        axis.set_ylabel("micro-batch")
        figure.colorbar(image, ax=axis, label="estimated time")
    figure.suptitle("Per-rank work per micro-batch (upstream_bench, 64 ranks, 512 sequences)")
    figure.tight_layout()
    figure.savefig(os.path.join(out_dir, "rank_work.png"), dpi=110)
    plt.close(figure)


def _plot_ratios(plt, grid: dict, out_dir: str, num_ranks: int) -> None:
    """Critical path / latency-aware bound per workload and scheduler at one scale."""
    keys = [key for key in grid if key.endswith(f"/{num_ranks}")]
    names = [name for name, run in grid[keys[0]]["schedulers"].items() if "error" not in run]
    figure, axis = plt.subplots(figsize=(10, 4))
    width = 0.8 / len(names)
    for offset, name in enumerate(names):
        values = [grid[key]["schedulers"][name].get("ratio_latency", float("nan"))
                  for key in keys]
        axis.bar([index + offset * width for index in range(len(keys))], values, width,
                 label=name)
    axis.axhline(1.05, color="red", linestyle="--", linewidth=1, label="1.05 x bound")
    axis.set_xticks([index + 0.4 - width / 2 for index in range(len(keys))])
    axis.set_xticklabels([key.split("/")[0] for key in keys])
    axis.set_ylabel("critical path / latency-aware bound")
    axis.set_ylim(0.9, max(2.0, axis.get_ylim()[1]))
    axis.legend(fontsize=8)
    axis.set_title(f"Critical path over the lower bound, {num_ranks} ranks")
    figure.tight_layout()
    figure.savefig(os.path.join(out_dir, f"ratio_to_bound_{num_ranks}.png"), dpi=110)
    plt.close(figure)


def _plot_latency(plt, latency: dict, out_dir: str) -> None:
    """Scheduler wall time vs number of ranks (64 sequences per rank)."""
    figure, axis = plt.subplots(figsize=(6, 4))
    scales = sorted(latency, key=int)
    names = [name for name in next(iter(latency.values())) if name != "num_sequences"
             and (not name.endswith("(wall)") or name.startswith("upstream"))]
    for name in names:
        points = [(int(scale), latency[scale][name]) for scale in scales if name in latency[scale]]
        if not points:
            continue
        axis.plot(*zip(*points), marker="o", label=name)
    axis.plot([64], [10], "r*", markersize=12, label="target 10 ms (4,096 seqs)")
    axis.plot([1024], [200], "r^", markersize=10, label="target 200 ms (65,536 seqs)")
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    axis.set_xlabel("DPxCP ranks (64 sequences per rank)")
    axis.set_ylabel("scheduler time [ms] (ours: CPU; upstream: wall)")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(os.path.join(out_dir, "latency.png"), dpi=110)
    plt.close(figure)


def write_plots(results: dict, work: dict, out_dir: str) -> None:
    """All PNGs of the report."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _plot_rank_work(plt, work, out_dir)
    for num_ranks in (8, 64):
        _plot_ratios(plt, results["grid"], out_dir, num_ranks)
    if results["latency"]:
        _plot_latency(plt, results["latency"], out_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/scheduling")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="8 and 64 ranks only (smoke run)")
    parser.add_argument("--upstream-megatron", default=None, metavar="PATH",
                        help="a local Megatron-LM checkout: also run upstream's own schedulers")
    parser.add_argument("--hardware-profile", default="h100_nvlink", metavar="NAME|PATH",
                        help="the cost model's rates: a profile name or a JSON profile measured "
                             "by tools/measure_cost_model.py (default: the analytic h100_nvlink)")
    args = parser.parse_args(argv)
    try:
        cost = CostModel.for_model(DEFAULT_HIDDEN_SIZE, args.hardware_profile)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    upstream = args.upstream_megatron
    if upstream is not None:
        try:
            check_checkout(upstream)
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    os.makedirs(args.out, exist_ok=True)
    started = time.time()
    log = print
    scales = SCALES[:2] if args.quick else SCALES
    results = {
        "default_cost": cost.as_dict(),
        "hardware_profile": args.hardware_profile,
        "upstream": ({"path": os.path.abspath(upstream), "commit": upstream_commit(upstream)}
                     if upstream else None),
        "grid": run_grid(cost, scales, SEQUENCES_PER_RANK, args.seed, log, upstream),
        "small_batches": run_grid(cost, (64,), SMALL_BATCH_SEQUENCES_PER_RANK,
                                  args.seed, log, upstream),
        "attention_only": run_grid(ATTENTION_ONLY, (64,), SEQUENCES_PER_RANK, args.seed, log,
                                   upstream),
        "latency": run_latency(cost, args.seed, log, upstream) if not args.quick else {},
        "target_latency": run_target_latency(cost, args.seed, log) if not args.quick else {},
        "pipeline": run_pipeline(cost, args.seed),
    }
    workload = WORKLOADS[0]
    (batch,) = sample_batches(workload, SMALL_BATCH_SEQUENCES_PER_RANK * 64, 1, args.seed)
    problem = make_problem(workload, batch, 64, cost)
    work = {name: per_rank_work(problem, name) for name in ("dp_balanced", "default_dynamic_cp")}
    results["runtime_s"] = time.time() - started
    with open(os.path.join(args.out, "results.json"), "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=1, sort_keys=True)
    write_plots(results, work, args.out)
    with open(os.path.join(args.out, "REPORT.md"), "w", encoding="utf-8") as handle:
        handle.write(render_report(results, " ".join(["python", *sys.argv])))
    log(f"done in {time.time() - started:.0f} s; report: {os.path.join(args.out, 'REPORT.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
