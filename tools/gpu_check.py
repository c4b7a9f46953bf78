#!/usr/bin/env python3
"""The GPU check: everything a GPU session should learn, in one command within one deadline.

    make gpu-check                                  # = python3 tools/gpu_check.py, 480 s
    python3 tools/gpu_check.py --parts benchmark --sizes 2.8b --budget-s 300
    python3 tools/gpu_check.py --device cpu --out /tmp/gpu_check   # the CPU dry run (tiny)

Made for a lent GPU machine (Python 3.12, a CUDA torch, no network; README "GPU"): it first
installs the megatron-core wheel sent along in ``.whl/`` when megatron-core does not import,
then runs its parts in order, each in its own process with its own timeout, cut to what is left
of one global deadline (``--budget-s``), never stopping at a failure:

=========  ==================================================================================
probe      tools/gpu_probe.py: versions, real kernel vs twin, causal alignment, sync baseline,
           bias-dropout-add probe, gloo collectives on CUDA tensors
gpu_tests  ``pytest -m gpu tests/gpu`` (parallel workers when pytest-xdist is there)
benchmark  tools/benchmark_gpu.py at ``--sizes``: packed / padded / plain-PyTorch reference
cost       tools/measure_cost_model.py: the measured hardware profile
suite      the CPU suite with CUDA visible: a CUDA-sensitive subset, or all (``--suite all``)
=========  ==================================================================================

Logs go to ``--out`` (``$OUT`` when set, else /tmp/gpu_check), at most 8 files:
``summary.txt``, ``<part>.log`` for each part, ``benchmark.json`` and ``hardware_profile.json``.
A summary table ends the output. Exit code: the number of parts that failed or timed out.
"""

from __future__ import annotations

if not __package__:  # run as `python tools/X.py`: the repository root on sys.path
    import _repo_root  # noqa: F401

import argparse
import dataclasses
import glob
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_BUDGET_S = 480
# A part that would get less than this (or than its own cap) is skipped: it could not even
# start its interpreter.
MIN_PART_S = 15
SITE_DIR = "/tmp/site"
WHEEL_GLOB = ".whl/*.whl"
# The tests whose behaviour can change when CUDA is visible (device choice, the CPU device
# layer, the harness, attention backends, the step's kernels and reductions, the GPU tools).
CUDA_SENSITIVE_TESTS = (
    "tests/unit_tests/varlen/test_device_choice.py", "tests/unit_tests/varlen/test_cpu_device.py",
    "tests/unit_tests/varlen/test_multirank.py", "tests/unit_tests/varlen/attention",
    "tests/unit_tests/varlen/test_no_host_reads.py", "tests/unit_tests/varlen/test_host_syncs.py",
    "tests/unit_tests/varlen_training/test_flash_backend_training.py",
    "tests/unit_tests/varlen_training/test_optimizer_kernels.py",
    "tests/unit_tests/varlen_training/test_step_host_reads.py",
    "tests/unit_tests/varlen_training/test_grad_reduction.py",
    "tests/unit_tests/varlen_training/test_packing_equivalence.py",
    "tests/unit_tests/varlen_training/test_bf16.py", "tests/unit_tests/test_benchmark_gpu.py",
    "tests/unit_tests/tools/test_measure_cost_model.py", "tests/unit_tests/tools/test_sync_probe.py",
)
DRY_RUN_TESTS = ("tests/unit_tests/test_benchmark_gpu.py",)


@dataclasses.dataclass(frozen=True)
class Part:
    """One step of the check: a command, its own time cap, and what it leaves in ``--out``."""

    name: str
    cap_s: int
    command: list[str]
    keep: tuple[tuple[str, str], ...] = ()  # (file it writes, name to keep it under in out)


@dataclasses.dataclass
class Outcome:
    name: str
    status: str  # ok, failed (rc), timeout, skipped
    seconds: float
    detail: str


def _pytest(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:randomly", *args]


def _workers(count: int) -> list[str]:
    return ["-n", str(count)] if importlib.util.find_spec("xdist") else []


def plan_parts(cli: argparse.Namespace, scratch: Path) -> list[Part]:
    """The parts for this device and these options, in running order."""
    py, cpu = sys.executable, cli.device == "cpu"
    bench_out = scratch / "benchmark"
    bench = [py, "tools/benchmark_gpu.py", "--out", str(bench_out), "--device", cli.device]
    bench += ["--tiny", "--iters", "1", "--warmup", "1"] if cpu else [
        "--sizes", cli.sizes, "--iters", str(cli.iters), "--warmup", "2", "--timeout", "150"]
    cost = [py, "tools/measure_cost_model.py", "--device", cli.device,
            "--out", str(scratch / "hardware_profile.json")]
    cost += ["--tiny", "--reps", "1"] if cpu else ["--reps", "5"]
    if cli.suite == "all":
        suite = _pytest("tests", "--ignore=tests/gpu", *_workers(cli.workers), "--timeout", "300")
    else:
        selection = DRY_RUN_TESTS if cpu else CUDA_SENSITIVE_TESTS
        suite = _pytest(*selection, *_workers(0 if cpu else cli.workers), "--timeout", "300")
    return [
        Part("probe", 120, [py, "tools/gpu_probe.py", "--device", cli.device]),
        Part("gpu_tests", 300, _pytest("-m", "gpu", "tests/gpu", *_workers(0 if cpu else 4),
                                       "--timeout", "240")),
        Part("benchmark", 300, bench, keep=((str(bench_out / "results.json"),
                                             "benchmark.json"),)),
        Part("cost", 120, cost, keep=((str(scratch / "hardware_profile.json"),
                                       "hardware_profile.json"),)),
        Part("suite", 600, suite),
    ]


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:160] if lines else ""


def run_part(part: Part, deadline: float, out: Path, env: dict) -> Outcome:
    """Runs ``part`` with min(its cap, the time left); its output goes to ``<out>/<name>.log``."""
    left = deadline - time.monotonic()
    if left < min(MIN_PART_S, part.cap_s):
        return Outcome(part.name, "skipped", 0.0, f"{max(left, 0):.0f} s left of the budget")
    cap = min(part.cap_s, left)
    print(f"=== {part.name} (cap {cap:.0f} s): {' '.join(part.command)}", flush=True)
    start, log = time.monotonic(), out / f"{part.name}.log"
    with open(log, "w", encoding="utf-8") as handle:
        proc = subprocess.Popen(part.command, cwd=REPO, env=env, stdout=handle,
                                stderr=subprocess.STDOUT, start_new_session=True)
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
    return Outcome(part.name, status, seconds, detail)


def summary_table(outcomes: list[Outcome]) -> str:
    rows = [("part", "status", "seconds", "last line")]
    rows += [(o.name, o.status, f"{o.seconds:.0f}", o.detail) for o in outcomes]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return "\n".join("  ".join([*(cell.ljust(w) for cell, w in zip(row[:3], widths)), row[3]])
                     for row in rows)


def ensure_megatron_core(env: dict) -> str:
    """Installs the sent-along megatron-core wheel when megatron-core does not import; returns
    what happened (one line). The parts find it through ``env['PYTHONPATH']``."""
    try:
        if importlib.util.find_spec("megatron.core") is not None:
            return "megatron-core imports"
    except ModuleNotFoundError:  # no "megatron" package at all
        pass
    wheels = sorted(glob.glob(str(REPO / WHEEL_GLOB)))
    if not wheels:
        return f"megatron-core missing and no wheel in {WHEEL_GLOB} (README, section GPU)"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index",
                           "--no-deps", "--no-compile", "--target", SITE_DIR, *wheels],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return f"wheel install failed: {_last_line(proc.stderr)}"
    env["PYTHONPATH"] = os.pathsep.join([SITE_DIR, env["PYTHONPATH"]])
    return f"installed {', '.join(Path(w).name for w in wheels)} into {SITE_DIR}"


def _env() -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(REPO), env.get("PYTHONPATH", "")] if p)
    # Compiled kernels (Triton, inductor) are shared by the parts' processes.
    env.setdefault("TRITON_CACHE_DIR", "/tmp/gpu_check_triton")
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", "/tmp/gpu_check_inductor")
    return env


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--budget-s", type=int, default=DEFAULT_BUDGET_S,
                        help="the deadline for all parts together")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT",
                                                                        "/tmp/gpu_check")))
    parser.add_argument("--parts", default=None, help="comma-separated subset, in order")
    parser.add_argument("--sizes", default="184m", help="benchmark sizes (184m,1.3b,2.8b)")
    parser.add_argument("--iters", type=int, default=8, help="benchmark steps measured")
    parser.add_argument("--suite", choices=("subset", "all"), default="subset")
    parser.add_argument("--workers", type=int, default=8, help="pytest-xdist workers")
    cli = parser.parse_args(argv)
    if cli.budget_s < MIN_PART_S:
        parser.error(f"--budget-s {cli.budget_s} is below the {MIN_PART_S} s a part needs")
    deadline = time.monotonic() + cli.budget_s
    cli.out.mkdir(parents=True, exist_ok=True)
    env = _env()
    print(ensure_megatron_core(env), flush=True)
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as scratch:
        parts = plan_parts(cli, Path(scratch))
        if cli.parts:
            wanted = cli.parts.split(",")
            unknown = sorted(set(wanted) - {p.name for p in parts})
            if unknown:
                parser.error(f"--parts {','.join(unknown)}: choose from "
                             f"{','.join(p.name for p in parts)}")
            parts = [p for p in parts if p.name in wanted]
        outcomes = [run_part(part, deadline, cli.out, env) for part in parts]
    table = summary_table(outcomes)
    (cli.out / "summary.txt").write_text(table + "\n", encoding="utf-8")
    print("=== summary\n" + table, flush=True)
    return sum(o.status not in ("ok", "skipped") for o in outcomes)


if __name__ == "__main__":
    sys.exit(main())
