#!/usr/bin/env python3
"""The GPU check: everything a GPU session should learn, in one command within one deadline.

    make gpu-check                                  # = python3 tools/gpu_check.py, 480 s
    python3 tools/gpu_check.py --parts suite --suite all1,all2 --budget-s 330   # README "GPU"
    python3 tools/gpu_check.py --device cpu --out /tmp/gpu_check   # the CPU dry run (tiny)

Made for a lent GPU machine (Python 3.12, a CUDA torch, no network; README "GPU"): it first
installs the wheels sent along in ``.whl/`` whose package the machine lacks (megatron-core,
the ``data`` and ``metrics`` extras: tools/gpu_wheels.py), then runs its parts in order, each
in its own process with its own cap, never stopping at a failure:

=========  ==================================================================================
probe      tools/gpu_probe.py: versions, real kernel vs twin, causal alignment, sync baseline,
           bias-dropout-add probe, gloo collectives on CUDA tensors
benchmark  tools/benchmark_gpu.py at ``--sizes`` / ``--configs``: packed, reference (padded)
cost       tools/measure_cost_model.py at ``--cost-size``: the measured hardware profile
gpu_tests  ``pytest -m gpu tests/gpu`` (parallel workers when pytest-xdist is there)
suite      the suite with CUDA visible: a CUDA-sensitive subset, or ``--suite all1`` / ``all2``
           (``--suite all1,all2``: both halves, one after the other, into one ``suite.log``)
=========  ==================================================================================

Timing parts first, on a quiet machine. Each part's cap is its expected time on the slowest H100
host logged (tools/gpu_part_times.py: the GPU sessions' logs) times a margin; with the default
options the caps and the wheel install fit the 480 s budget, so no part is cut short by another.
The plan is printed first. A part still left with too little of ``--budget-s`` is skipped and
shown so. The test parts name each failing test as it fails (tools/pytest_failures_now.py), so a
part cut at its cap still names them.

Logs go to ``--out`` (``$OUT`` when set, else /tmp/gpu_check), at most 8 files:
``summary.txt``, ``<part>.log`` for each part, ``benchmark.json`` and ``hardware_profile.json``.
A summary table ends the output. Exit code: the number of parts that did not pass (failed,
timed out, or skipped for lack of budget): 0 only when everything asked for ran and passed.
"""

from __future__ import annotations

if not __package__:  # run as `python tools/X.py`: the repository root on sys.path
    import _repo_root  # noqa: F401

import argparse
import dataclasses
import importlib.util
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tools import gpu_part_times as times
from tools.benchmark_gpu import CONFIGS, SIZES, run_order
from tools.gpu_wheels import import_report, install_missing

REPO = Path(__file__).resolve().parents[1]
DEFAULT_BUDGET_S = 480
# What the wheel install, its import check and starting the parts take besides the parts
# (results/gpu/h100/run4: make gpu-check ended in 453 s, its parts took 424 s).
INSTALL_ALLOWANCE_S = 30
# A part that would get less than this (or than its own cap) is skipped: it could not even
# start its interpreter.
MIN_PART_S = 15
# A part's cap over its expected time. The times are the slowest H100 host's logged (its
# host-bound 184m step 1.7x another host's), so the margin is for run-to-run noise; with a larger
# one the default parts would not fit 480 s on that host.
CAP_MARGIN = 1.15
# The benchmark configurations of a default check: the packed / reference ratio. Padded (its
# ratio is logged: 4.01x) would not fit the 480 s on the slow host: ``--configs`` names it.
DEFAULT_CONFIGS = "packed,reference"
# pytest's per-test timeout in the test parts: a hung test shows its stack and the others go on.
TEST_TIMEOUT_S = 240
# The benchmark's warm-up steps (its measured steps: --iters).
BENCHMARK_WARMUP = 2
# The tests whose behaviour can change when CUDA is visible (device choice, the CPU device
# layer, the harness, attention backends, the step's kernels and reductions, the GPU tools).
# (The cost model's and packing equivalence's CPU tests left it for the whole suite: the cost part
# runs the tool itself on the GPU, and the equivalence runs are CPU ranks wherever CUDA is.)
CUDA_SENSITIVE_TESTS = (
    "tests/unit_tests/varlen/test_device_choice.py", "tests/unit_tests/varlen/test_cpu_device.py",
    "tests/unit_tests/varlen/test_multirank.py", "tests/unit_tests/varlen/attention",
    "tests/unit_tests/varlen/test_no_host_reads.py", "tests/unit_tests/varlen/test_host_syncs.py",
    "tests/unit_tests/varlen_training/test_flash_backend_training.py",
    "tests/unit_tests/varlen_training/test_optimizer_kernels.py",
    "tests/unit_tests/varlen_training/test_step_host_reads.py",
    "tests/unit_tests/varlen_training/test_grad_reduction.py",
    "tests/unit_tests/varlen_training/test_bf16.py", "tests/unit_tests/test_benchmark_gpu.py",
    "tests/unit_tests/tools/test_sync_probe.py",
)
# The whole suite (tests/ but tests/gpu) in two halves by folder, each inside one 600 s device
# command (tools/gpu_part_times.py); ``--suite all`` runs both in one process.
SECOND_HALF = ("tests/unit_tests/varlen_training", "tests/unit_tests/wrap")
SUITE_HALVES = {
    "all1": ("tests", "--ignore=tests/gpu", *(f"--ignore={folder}" for folder in SECOND_HALF)),
    "all2": SECOND_HALF,
    "all": ("tests", "--ignore=tests/gpu"),
}
SUBSET = "subset"  # --suite's default: CUDA_SENSITIVE_TESTS
# The CPU dry run's suite part: one quick file, through pytest-xdist as on the GPU.
DRY_RUN_TESTS = ("tests/unit_tests/tools/test_gpu_wheels.py",)
DRY_RUN_WORKERS = 2
# One torch thread per suite worker: its models are tiny, and spare threads cost much under load
# (the position-table fuzz, a quiet 2-core machine: 12 s on 1 thread, 19 s on 2; with other
# processes busy, 78 s alone to 600+ s).
SUITE_THREADS = 1
# The suite's log lists its slowest tests (the next plan's durations).
SLOWEST_TESTS_SHOWN = 25


@dataclasses.dataclass(frozen=True)
class Part:
    """One step of the check: a command, its own time cap, and what it leaves in ``--out``."""

    name: str
    cap_s: int
    command: list[str]
    keep: tuple[tuple[str, str], ...] = ()  # (file it writes, name to keep it under in out)
    expected_s: float = 0.0  # on one H100 (tools/gpu_part_times.py)
    env: tuple[tuple[str, str], ...] = ()  # set for this part only
    log: str = ""  # its log's name in ``--out`` (without .log); default: the part's name

    @property
    def log_name(self) -> str:
        return f"{self.log or self.name}.log"


@dataclasses.dataclass
class Outcome:
    name: str
    status: str  # ok, failed (rc), timeout, skipped
    seconds: float
    detail: str
    cap_s: float = 0.0


def _pytest(*args: str) -> list[str]:
    """pytest, naming each failure as it happens: a part cut at its cap prints no end summary."""
    return [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:randomly",
            "-p", "tools.pytest_failures_now", *args]


def _threads_env(threads: int) -> tuple[tuple[str, str], ...]:
    """torch's threads per pytest process: by default each takes every core, and 8 workers would
    run 8 x 16 threads on 16 cores (a rank of the harness runs on one thread anyway)."""
    return (("OMP_NUM_THREADS", str(max(1, threads))),)


def _cores_per(workers: int) -> int:
    return (os.cpu_count() or 1) // max(1, workers)


def _workers(count: int) -> list[str]:
    """pytest-xdist's options for ``count`` workers (none without it, or for 0): tests marked
    with one ``xdist_group`` run in one worker (``--dist loadgroup``)."""
    if not count or importlib.util.find_spec("xdist") is None:
        return []
    return ["-n", str(count), "--dist", "loadgroup"]


def _cap(expected_s: float) -> int:
    return max(MIN_PART_S, math.ceil(expected_s * CAP_MARGIN))


def benchmark_timeouts(cli: argparse.Namespace) -> dict[str, int]:
    """Each configuration's process timeout: its slowest size's expected time on the slow host,
    with the margin."""
    steps = BENCHMARK_WARMUP + cli.iters + times.BENCHMARK_EXTRA_STEPS
    return {config: _cap(max(times.benchmark_seconds(size, config, steps)
                             for size in cli.sizes.split(",")))
            for config in run_order(cli.configs)}


def benchmark_part(cli: argparse.Namespace, scratch: Path) -> Part:
    """tools/benchmark_gpu.py at --sizes x --configs (on CPU: the tiny shape, no estimate)."""
    out = scratch / "benchmark"
    command = [sys.executable, "tools/benchmark_gpu.py", "--out", str(out), "--device",
               cli.device, "--configs", cli.configs, "--warmup", str(BENCHMARK_WARMUP)]
    keep = ((str(out / "results.json"), "benchmark.json"),)
    if cli.device == "cpu":
        command += ["--tiny", "--iters", "1", "--timeout", str(cli.budget_s)]
        return Part("benchmark", cli.budget_s, command, keep=keep)
    steps = BENCHMARK_WARMUP + cli.iters + times.BENCHMARK_EXTRA_STEPS
    expected = sum(times.benchmark_seconds(size, config, steps)
                   for size in cli.sizes.split(",") for config in run_order(cli.configs))
    timeouts = ",".join(f"{config}={s}" for config, s in benchmark_timeouts(cli).items())
    command += ["--sizes", cli.sizes, "--iters", str(cli.iters), "--timeout", timeouts]
    return Part("benchmark", _cap(expected), command, keep=keep, expected_s=expected)


def _cost_model_seconds(size: str, reps: int) -> float:
    """The cost tool's time from the faster host's benchmark table (start-up, then every pack)."""
    from tools.measure_cost_model import WARMUP_RUNS, pack_shapes

    packed = times.BENCHMARK_PROCESS[size, "packed"]
    per_token = packed.step_s / times.STEP_TOKENS
    one_pass = sum(per_token * sum(pack) + times.COST_PACK_OVERHEAD_S for pack in pack_shapes())
    return packed.startup_s + (WARMUP_RUNS + reps) * one_pass


def cost_seconds(size: str, reps: int) -> float:
    """Expected seconds of tools/measure_cost_model.py at ``size`` on the slow H100 host: the
    model's estimate scaled by what that host took at 184m (5 reps) over the model's."""
    slow_host = times.SLOW_HOST_COST_184M_S / _cost_model_seconds("184m", 5)
    return _cost_model_seconds(size, reps) * slow_host


def cost_part(cli: argparse.Namespace, scratch: Path) -> Part:
    profile = scratch / "hardware_profile.json"
    command = [sys.executable, "tools/measure_cost_model.py", "--device", cli.device,
               "--out", str(profile)]
    keep = ((str(profile), "hardware_profile.json"),)
    if cli.device == "cpu":
        return Part("cost", cli.budget_s, command + ["--tiny", "--reps", "1"], keep=keep)
    expected = cost_seconds(cli.cost_size, cli.cost_reps)
    command += ["--size", cli.cost_size, "--reps", str(cli.cost_reps)]
    return Part("cost", _cap(expected), command, keep=keep, expected_s=expected)


def suite_part(cli: argparse.Namespace, suite: str = SUBSET, name: str = "suite") -> Part:
    """The suite with CUDA visible: all of tests/ but tests/gpu (its own part), or one of its
    halves, or the CUDA-sensitive subset; the CPU dry run runs one small file the same way."""
    if suite in SUITE_HALVES:
        selection = SUITE_HALVES[suite]
        expected = times.suite_seconds(times.SUITE_TESTS[suite])
        workers = cli.workers or times.SUITE_ALL_WORKERS
    elif cli.device == "cpu":
        selection, expected, workers = DRY_RUN_TESTS, 0.0, cli.workers or DRY_RUN_WORKERS
    else:
        selection, expected = CUDA_SENSITIVE_TESTS, times.SUITE_SUBSET_S
        workers = cli.workers or times.SUITE_SUBSET_WORKERS
    command = _pytest(*selection, *_workers(workers), "--timeout", str(TEST_TIMEOUT_S),
                      "--durations", str(SLOWEST_TESTS_SHOWN))
    return Part(name, _cap(expected), command, expected_s=expected,
                env=_threads_env(SUITE_THREADS), log="suite")


def suite_parts(cli: argparse.Namespace) -> list[Part]:
    """One part per ``--suite`` selection, in the order named: ``suite`` for one,
    ``suite_<selection>`` for each of several (``all1,all2``: the second half starts when the
    first ends and takes what is left of the budget, so a half cut at the deadline still
    leaves the first one whole). They write one ``suite.log``: the files that come back from
    a device command stay at most 8."""
    suites = cli.suite.split(",")
    if len(suites) == 1:
        return [suite_part(cli, suites[0])]
    return [suite_part(cli, suite, f"suite_{suite}") for suite in suites]


def plan_parts(cli: argparse.Namespace, scratch: Path) -> list[Part]:
    """The parts for this device and these options, in running order. The caps are planned for
    an H100; the CPU dry run (tiny shapes, any CPU machine, any load) checks that the tool and
    its parts run, not their times: there each part may take what is left of the budget."""
    cpu = cli.device == "cpu"
    gpu_workers = 0 if cpu else times.GPU_TESTS_WORKERS
    gpu_tests = _pytest("-m", "gpu", "tests/gpu", *_workers(gpu_workers), "--timeout",
                        str(TEST_TIMEOUT_S))
    parts = [
        Part("probe", _cap(times.PROBE_S), [sys.executable, "tools/gpu_probe.py", "--device",
                                            cli.device], expected_s=times.PROBE_S),
        benchmark_part(cli, scratch),
        cost_part(cli, scratch),
        Part("gpu_tests", _cap(times.GPU_TESTS_S), gpu_tests, expected_s=times.GPU_TESTS_S,
             env=_threads_env(_cores_per(gpu_workers))),
        *suite_parts(cli),
    ]
    if cpu:
        return [dataclasses.replace(p, cap_s=cli.budget_s, expected_s=0.0) for p in parts]
    return parts


def plan_lines(parts: list[Part], budget_s: int) -> list[str]:
    """The plan, printed before the first part: each part's expected time on an H100 and its
    cap, and whether the caps fit the budget (when they do not, the last parts may be skipped).
    The CPU dry run has no expected times: each part may take what is left of the budget."""
    if not any(p.expected_s for p in parts):
        return [f"plan: CPU dry run, {', '.join(p.name for p in parts)}: each part may take what "
                f"is left of the {budget_s} s budget"]
    lines = [f"plan: {p.name} expected {p.expected_s:.0f} s, cap {p.cap_s} s" for p in parts]
    caps = sum(p.cap_s for p in parts) + INSTALL_ALLOWANCE_S
    expected = sum(p.expected_s for p in parts) + INSTALL_ALLOWANCE_S
    verdict = "fit" if caps <= budget_s else "EXCEED (the last parts may be skipped)"
    lines.append(f"plan: expected {expected:.0f} s in all; the caps and the wheel install "
                 f"({caps} s) {verdict} the {budget_s} s budget")
    return lines


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:160] if lines else ""


def run_part(part: Part, deadline: float, out: Path, env: dict, append: bool = False) -> Outcome:
    """Runs ``part`` with min(its cap, the time left); its output goes to its log in ``out``
    (``append``: after what an earlier part of this check wrote there)."""
    left = deadline - time.monotonic()
    if left < min(MIN_PART_S, part.cap_s):
        return Outcome(part.name, "skipped", 0.0,
                       f"not started: {max(left, 0):.0f} s left of the budget", part.cap_s)
    cap = min(part.cap_s, left)
    print(f"=== {part.name} (cap {cap:.0f} s): {' '.join(part.command)}", flush=True)
    start, log = time.monotonic(), out / part.log_name
    with open(log, "a" if append else "w", encoding="utf-8") as handle:
        if append:
            handle.write(f"\n=== {part.name}\n")
            handle.flush()
        proc = subprocess.Popen(part.command, cwd=REPO, env={**env, **dict(part.env)},
                                stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=cap)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # the part and everything it started
            proc.wait()
            rc = None
    for source, name in part.keep:
        if os.path.exists(source):
            shutil.copyfile(source, out / name)
    seconds = time.monotonic() - start
    detail = _last_line(log.read_text(encoding="utf-8", errors="replace"))
    status = "timeout" if rc is None else "ok" if rc == 0 else f"failed ({rc})"
    return Outcome(part.name, status, seconds, detail, cap)


def summary_table(outcomes: list[Outcome]) -> str:
    rows = [("part", "status", "seconds", "cap", "last line")]
    rows += [(o.name, o.status, f"{o.seconds:.0f}", f"{o.cap_s:.0f}", o.detail)
             for o in outcomes]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join("  ".join([*(cell.ljust(w) for cell, w in zip(row[:4], widths)), row[4]])
                     for row in rows)


def exit_code(outcomes: list[Outcome]) -> int:
    """The number of parts that did not pass: failed, timed out or skipped for lack of budget
    (a check that could not run a part asked for is not a passed check)."""
    return sum(o.status != "ok" for o in outcomes)


def _env(device: str = "cuda") -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if device == "cpu":  # the dry run is the CPU's also on a GPU machine (in its suite run)
        env["CUDA_VISIBLE_DEVICES"] = ""
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(REPO), env.get("PYTHONPATH", "")] if p)
    # Compiled kernels (Triton, inductor) are shared by the parts' processes.
    env.setdefault("TRITON_CACHE_DIR", "/tmp/gpu_check_triton")
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", "/tmp/gpu_check_inductor")
    return env


def _parse(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--budget-s", type=int, default=DEFAULT_BUDGET_S,
                        help="the deadline for all parts together")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT",
                                                                        "/tmp/gpu_check")))
    parser.add_argument("--parts", default=None, help="comma-separated subset, in order")
    parser.add_argument("--sizes", default="184m", help="benchmark sizes (184m,1.3b,2.8b)")
    parser.add_argument("--configs", default=DEFAULT_CONFIGS,
                        help=f"benchmark configurations, run in the order {','.join(CONFIGS)}")
    parser.add_argument("--iters", type=int, default=8, help="benchmark steps measured")
    parser.add_argument("--cost-size", default="184m", choices=sorted(SIZES),
                        help="the model the cost model is measured on")
    parser.add_argument("--cost-reps", type=int, default=5, help="cost model repetitions")
    parser.add_argument("--suite", default=SUBSET,
                        help="the CUDA-sensitive subset, the whole suite's first or second half "
                             "(all1, all2: one 600 s device command each), or all of it; several "
                             "comma-separated run one after the other (all1,all2)")
    parser.add_argument("--workers", type=int, default=0,
                        help="pytest-xdist workers of the suite (0: the planned default)")
    cli = parser.parse_args(argv)
    if cli.budget_s < MIN_PART_S:
        parser.error(f"--budget-s {cli.budget_s} is below the {MIN_PART_S} s a part needs")
    for option, chosen, known in (("--sizes", cli.sizes, SIZES), ("--configs", cli.configs,
                                                                  CONFIGS),
                                  ("--suite", cli.suite, (SUBSET, *SUITE_HALVES))):
        unknown = sorted(set(chosen.split(",")) - set(known))
        if unknown:
            parser.error(f"{option} {','.join(unknown)}: choose from {','.join(known)}")
    return cli


def _select(parts: list[Part], wanted: str | None) -> list[Part]:
    """The parts named by --parts, in the order named (all of them without --parts); parts
    that share a log go by its name (``suite`` names both of ``--suite all1,all2``)."""
    if not wanted:
        return parts
    by_name: dict[str, list[Part]] = {}
    for part in parts:
        by_name.setdefault(part.log or part.name, []).append(part)
    unknown = [name for name in wanted.split(",") if name not in by_name]
    if unknown:
        raise SystemExit(f"gpu_check.py: error: --parts {','.join(unknown)}: choose from "
                         f"{','.join(by_name)}")
    return [part for name in wanted.split(",") for part in by_name[name]]


def main(argv=None) -> int:
    cli = _parse(argv)
    deadline = time.monotonic() + cli.budget_s
    cli.out.mkdir(parents=True, exist_ok=True)
    env = _env(cli.device)
    print(install_missing(REPO, env, dry_run=cli.device == "cpu"), flush=True)
    print(import_report(env), flush=True)
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as scratch:
        parts = _select(plan_parts(cli, Path(scratch)), cli.parts)
        print("\n".join(plan_lines(parts, cli.budget_s)), flush=True)
        outcomes, written = [], set()
        for part in parts:
            outcomes.append(run_part(part, deadline, cli.out, env,
                                     append=part.log_name in written))
            written.add(part.log_name)
    table = summary_table(outcomes)
    (cli.out / "summary.txt").write_text(table + "\n", encoding="utf-8")
    print("=== summary\n" + table, flush=True)
    return exit_code(outcomes)


if __name__ == "__main__":
    sys.exit(main())
