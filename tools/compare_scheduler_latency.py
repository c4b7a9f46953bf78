"""Side-by-side latency of default_dynamic_cp: this tree vs another checkout of the scheduler.

Both versions schedule the same batches (the benchmark workloads, same seeds) in the same run,
alternating round by round so machine load hits both alike; each round times ``--reps`` calls
and keeps the best (CPU time by the tree's own ``timed_schedule``: thread time since
``c1af4b3``, process time before, which agree here since the worker makes no BLAS call), and
the report gives the median over rounds, the best over all rounds (the least disturbed by
other users of a shared machine) and the ratios old / new (> 1: this tree is faster). Each
version runs in its own subprocess with PYTHONPATH set to its tree, so nothing is imported
across trees.

    mkdir -p /tmp/oldsched /tmp/newsched
    git archive b6e34e8 megatron | tar -x -C /tmp/oldsched
    git archive HEAD megatron tools | tar -x -C /tmp/newsched
    python tools/compare_scheduler_latency.py --old /tmp/oldsched --new /tmp/newsched

Extract both trees the same way: in A/A runs (the same code twice) this repository's own
tree measured 3-7% slower than an identical extracted copy, two copies under /tmp within +-3%.

Also prints each version's critical path per batch, so a speed-up cannot hide a worse schedule.
With ``--gate`` it exits 1 when this tree's best time misses a target or a critical path is
longer than the other tree's: the side-by-side gate a scheduler fast path must pass.

With ``--instructions`` it counts instead of timing: each (tree, workload, scale) runs under
valgrind's cachegrind twice, with ``--reps`` calls and with none, and the difference divided by
``--reps`` is the instructions one call executes (OpenBLAS on one thread: its idle worker
threads poll, which would otherwise add a varying count). The count is exact from run to run
(measured: identical to 5 digits), so it resolves changes of 0.5% that the shared machine's
timing noise (+-10%) hides; it is a proxy for time (memory stalls are not in it).
"""

from __future__ import annotations

if not __package__:  # run as `python tools/X.py`: the repository root on sys.path
    import _repo_root  # noqa: F401

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SCALES = ("64:64", "1024:64")  # ranks:sequences per rank, where the targets are set
TARGET_MS = {64: 10.0, 1024: 200.0}  # ranks: a call's latency target (docs/SCHEDULING.md)

# Runs inside each tree's subprocess: times every (workload, scale) once per call.
_WORKER = r"""
import json, sys, time
import os
from megatron.varlen.scheduling.cost_model import CostModel
spec = json.loads(sys.argv[1])
# The benchmark moved out of the library into tools/scheduling/; older trees have it inside.
# Decide by the tree's own files (the dev venv also puts this repository's tools/ on sys.path).
if os.path.isdir(os.path.join(spec["tree"], "tools", "scheduling")):
    from tools.scheduling.benchmark import WORKLOADS, make_problem, sample_batches, timed_schedule
    from megatron.varlen.scheduling.schedule_evaluation import microbatch_levels
else:
    from megatron.varlen.scheduling.benchmark import WORKLOADS, make_problem, sample_batches
    from megatron.varlen.scheduling.benchmark import timed_schedule
    from megatron.varlen.scheduling.metrics import microbatch_levels
import megatron.varlen.scheduling.dynamic_cp as dynamic_cp
assert dynamic_cp.__file__.startswith(spec["tree"]), f"imported {dynamic_cp.__file__}"
out = {}
for name in spec["workloads"]:
    workload = next(w for w in WORKLOADS if w.name == name)
    for ranks, per_rank in spec["scales"]:
        lengths = sample_batches(workload, ranks * per_rank, 1, spec["seed"])[0]
        problem = make_problem(workload, lengths, ranks, CostModel())
        reps = spec["reps"] if ranks <= 64 else max(1, spec["reps"] // 4)
        schedule, wall, cpu = timed_schedule(problem, "default_dynamic_cp", reps)
        path = float(sum(microbatch_levels(problem, schedule)))
        out[f"{name}/{ranks}"] = {"cpu_ms": cpu, "wall_ms": wall, "critical_path": path}
print(json.dumps(out))
"""


def _run_tree(tree: Path, spec: dict) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    spec = dict(spec, tree=str(tree.resolve()))
    # The same neutral working directory for both trees (an A/A run with the tree itself as
    # cwd measured the repository 4-5% slower than an identical copy elsewhere).
    with tempfile.TemporaryDirectory() as neutral:
        result = subprocess.run([sys.executable, "-c", _WORKER, json.dumps(spec)], env=env,
                                cwd=neutral, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        sys.exit(f"scheduler run in {tree} failed:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


# One (workload, scale) per process, ``reps`` untimed calls after a warm-up call.
_COUNT_WORKER = r"""
import json, sys
from megatron.varlen.scheduling.cost_model import CostModel
from tools.scheduling.benchmark import WORKLOADS, make_problem, sample_batches
from megatron.varlen.scheduling.dynamic_cp import default_dynamic_cp
spec = json.loads(sys.argv[1])
workload = next(w for w in WORKLOADS if w.name == spec["workload"])
ranks, per_rank = spec["scale"]
lengths = sample_batches(workload, ranks * per_rank, 1, spec["seed"])[0]
problem = make_problem(workload, lengths, ranks, CostModel())
default_dynamic_cp(problem)
for _ in range(spec["reps"]):
    default_dynamic_cp(problem)
"""


def _count_instructions(tree: Path, spec: dict) -> float:
    """Instructions one default_dynamic_cp call executes (difference of two cachegrind runs)."""
    env = dict(os.environ, PYTHONPATH=str(tree), OPENBLAS_NUM_THREADS="1", PYTHONHASHSEED="0")
    totals = []
    for reps in (spec["reps"], 0):
        command = ["valgrind", "--tool=cachegrind", "--cache-sim=no",
                   "--cachegrind-out-file=/dev/null", sys.executable, "-c", _COUNT_WORKER,
                   json.dumps(dict(spec, reps=reps))]
        with tempfile.TemporaryDirectory() as neutral:
            result = subprocess.run(command, env=env, cwd=neutral, capture_output=True,
                                    text=True, check=False)
        match = re.search(r"I\s+refs:\s+([\d,]+)", result.stderr)
        if result.returncode != 0 or match is None:
            sys.exit(f"cachegrind run in {tree} failed:\n{result.stderr[-2000:]}")
        totals.append(int(match.group(1).replace(",", "")))
    return (totals[0] - totals[1]) / spec["reps"]


def _compare_instructions(args: argparse.Namespace, names: list[str],
                          scales: list[tuple[int, int]]) -> None:
    print(f"old = {args.old}, new = {args.new}; instructions per default_dynamic_cp call "
          f"(cachegrind, difference of {args.reps} calls and none), millions")
    print("| workload/ranks | old | new | new/old |")
    print("|---|---:|---:|---:|")
    for name in names:
        for scale in scales:
            spec = {"workload": name, "scale": scale, "seed": args.seed, "reps": args.reps}
            old, new = (_count_instructions(tree, spec) for tree in (args.old, args.new))
            print(f"| {name}/{scale[0]} | {old / 1e6:.2f} | {new / 1e6:.2f} | {new / old:.3f} |",
                  flush=True)


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", type=Path, required=True,
                        help="root of the other tree (holds megatron/varlen/scheduling)")
    parser.add_argument("--new", type=Path, default=REPO_ROOT, help="default: this repository")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per tree")
    parser.add_argument("--reps", type=int, default=8,
                        help="timed calls per round at <= 64 ranks (a quarter above)")
    parser.add_argument("--scales", nargs="+", default=list(DEFAULT_SCALES),
                        help="ranks:sequences_per_rank pairs")
    parser.add_argument("--workloads", nargs="+", default=None, help="default: all five")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions per call under valgrind instead of timing")
    parser.add_argument("--gate", action="store_true",
                        help="exit 1 if this tree's best time misses a target or a critical "
                             "path is longer than the other tree's")
    return parser.parse_args()


def main() -> None:
    args = _parse_args()
    for tree in (args.old, args.new):
        if not (tree / "megatron" / "varlen" / "scheduling").is_dir():
            sys.exit(f"--old/--new {tree} has no megatron/varlen/scheduling")
    names = args.workloads or ["upstream_bench", "ci", "rl_rollouts", "llama3_sft",
                               "pareto_tail"]
    scales = [tuple(int(part) for part in scale.split(":")) for scale in args.scales]
    if args.instructions:
        if shutil.which("valgrind") is None:
            sys.exit("--instructions needs valgrind on PATH (e.g. apt-get install valgrind)")
        _compare_instructions(args, names, scales)
        return
    spec = {"workloads": names, "scales": scales, "reps": args.reps, "seed": args.seed}
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    for index in range(args.rounds):
        order = ("old", "new") if index % 2 == 0 else ("new", "old")
        for label in order:
            runs[label].append(_run_tree(getattr(args, label), spec))
    print(f"old = {args.old}, new = {args.new}; median over {args.rounds} alternating rounds "
          f"of the best of {args.reps} (64 ranks) / {max(1, args.reps // 4)} calls, CPU ms")
    print("| workload/ranks | old ms (median) | new ms (median) | old/new (median) | "
          "old/new (best) | new best vs target | new CP / old CP |")
    print("|---|---:|---:|---:|---:|---|---:|")
    failed = []
    for key in runs["new"][0]:
        old = statistics.median(run[key]["cpu_ms"] for run in runs["old"])
        new = statistics.median(run[key]["cpu_ms"] for run in runs["new"])
        old_best = min(run[key]["cpu_ms"] for run in runs["old"])
        new_best = min(run[key]["cpu_ms"] for run in runs["new"])
        quality = runs["new"][0][key]["critical_path"] / runs["old"][0][key]["critical_path"]
        target = TARGET_MS.get(int(key.split("/")[1]))
        verdict = "n/a" if target is None else (
            f"{new_best:.1f} ms: {'met' if new_best <= target else 'MISSED'} ({target:g} ms)")
        print(f"| {key} | {old:.1f} | {new:.1f} | {old / new:.2f}x | {old_best / new_best:.2f}x "
              f"| {verdict} | {quality:.4f} |")
        if (target is not None and new_best > target) or quality > 1.0:
            failed.append(key)
    if args.gate and failed:
        sys.exit(f"gate: target missed or critical path longer on {', '.join(failed)}")


if __name__ == "__main__":
    main()
