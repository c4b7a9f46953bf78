"""tools/gpu_check.py: the CPU dry run of the whole check (so it cannot rot between GPU
sessions), and the runner's deadline, timeout and output rules on tiny fake parts."""

import importlib.util
import json
import sys
import time
from pathlib import Path

from tools import gpu_check

REPO = Path(__file__).resolve().parents[3]
MAX_FILES_BACK = 8  # what a GPU command brings back from $OUT
PART_ORDER = ["probe", "benchmark", "cost", "gpu_tests", "suite"]


def test_cpu_dry_run_runs_every_part(gpu_check_cpu_dry_run):
    """The dry run itself (tests/unit_tests/tools/conftest.py runs it once per session)."""
    out, proc = gpu_check_cpu_dry_run.out, gpu_check_cpu_dry_run.proc
    summary = (out / "summary.txt").read_text()
    rows = {line.split()[0]: line for line in summary.splitlines()[1:]}
    assert list(rows) == PART_ORDER, summary
    for name in ("probe", "gpu_tests", "benchmark", "suite"):
        assert rows[name].split()[1] == "ok", (name, summary, proc.stdout[-3000:])
    # CPU timings of a tiny model are mostly overhead: the fit may be refused, in one line.
    assert rows["cost"].split()[1] == "ok" or "the fit gave" in rows["cost"], summary
    assert proc.returncode == (0 if rows["cost"].split()[1] == "ok" else 1)
    assert "=== summary" in proc.stdout
    assert "wheels: would install" in proc.stdout and "imports: megatron.core ok" in proc.stdout
    assert "plan: CPU dry run" in proc.stdout
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= MAX_FILES_BACK and "benchmark.json" in files, files
    assert set(json.loads((out / "benchmark.json").read_text())["sizes"]) == {"tiny"}
    assert "[PASS] gloo" in (out / "probe.log").read_text()
    # CUDA hidden from the parts, also on a GPU machine: tests/gpu all skip
    assert "skipped" in rows["gpu_tests"] and "passed" not in rows["gpu_tests"], summary


def _parts(tmp_path, *commands):
    return [gpu_check.Part(f"p{i}", cap, [sys.executable, "-c", code])
            for i, (cap, code) in enumerate(commands)]


def test_a_part_over_its_cap_is_stopped_with_its_children(tmp_path):
    marker = tmp_path / "child.pid"
    code = (f"import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', "
            f"'import time; time.sleep(60)']); open({str(marker)!r}, 'w').write(str(c.pid)); "
            f"print('started', flush=True); time.sleep(60)")
    part = gpu_check.Part("slow", 2, [sys.executable, "-c", code])
    start = time.monotonic()
    outcome = gpu_check.run_part(part, time.monotonic() + 30, tmp_path, gpu_check._env())
    assert outcome.status == "timeout" and time.monotonic() - start < 15
    assert outcome.detail == "started"
    child = int(marker.read_text())
    time.sleep(0.5)
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text(
    ).split()[2]  # gone (or a zombie awaiting its reaper)


def test_the_deadline_cuts_and_skips_parts_and_failures_do_not_stop_the_run(tmp_path):
    env = gpu_check._env()
    deadline = time.monotonic() + 20
    fail = gpu_check.Part("fail", 10, [sys.executable, "-c", "import sys; print('x'); sys.exit(3)"])
    late = gpu_check.Part("late", 10, [sys.executable, "-c", "print('never')"])
    assert gpu_check.run_part(fail, deadline, tmp_path, env).status == "failed (3)"
    skipped = gpu_check.run_part(late, time.monotonic() + 5, tmp_path, env)
    assert skipped.status == "skipped" and not (tmp_path / "late.log").exists()
    assert skipped.detail.startswith("not started: ") and "left of the budget" in skipped.detail
    assert "skipped" in gpu_check.summary_table([skipped]).splitlines()[1]


def test_kept_files_are_copied_under_their_names(tmp_path):
    made = tmp_path / "made.json"
    part = gpu_check.Part("writer", 10, [sys.executable, "-c",
                                         f"open({str(made)!r}, 'w').write('{{}}')"],
                          keep=((str(made), "kept.json"),))
    out = tmp_path / "out"
    out.mkdir()
    assert gpu_check.run_part(part, time.monotonic() + 20, out, gpu_check._env()).status == "ok"
    assert (out / "kept.json").read_text() == "{}"


# --- the plan: every part given time inside the budget ----------------------------------------

H100_LOGS = sorted((REPO / "results" / "gpu" / "h100").glob("run*_benchmark_*.json"))


def _plan(*argv: str) -> list:
    cli = gpu_check._parse(list(argv))
    return gpu_check._select(gpu_check.plan_parts(cli, Path("/scratch")), cli.parts)


def test_the_default_plan_gives_every_part_time_inside_the_budget():
    parts = _plan()
    assert [p.name for p in parts] == PART_ORDER
    caps = sum(p.cap_s for p in parts) + gpu_check.INSTALL_ALLOWANCE_S
    assert caps <= gpu_check.DEFAULT_BUDGET_S, [(p.name, p.cap_s) for p in parts]
    for part in parts:  # a margin over the expected time, for a slower host
        assert part.cap_s >= 1.3 * part.expected_s > 0, part
    assert "fit the 480 s budget" in gpu_check.plan_lines(parts, gpu_check.DEFAULT_BUDGET_S)[-1]


def test_a_plan_over_its_budget_says_so_before_it_starts():
    parts = _plan("--parts", "benchmark", "--sizes", "184m,1.3b,2.8b")
    assert sum(p.cap_s for p in parts) > 300
    assert "EXCEED" in gpu_check.plan_lines(parts, 300)[-1]


def test_the_benchmark_estimate_agrees_with_the_logged_h100_processes():
    """The logged H100 benchmark processes (results/gpu/h100, the faster host's commands 1 and
    3) against the table's start-up + steps for the same iterations: within 15% each."""
    checked = 0
    for log in H100_LOGS:
        document = json.loads(log.read_text())
        command = document["command"].split()
        iters, warmup = (int(command[command.index(flag) + 1]) for flag in ("--iters", "--warmup"))
        steps = warmup + iters + gpu_check.times.BENCHMARK_EXTRA_STEPS
        for size, entry in document["sizes"].items():
            for config, result in entry["results"].items():
                estimate = gpu_check.times.BENCHMARK_PROCESS[size, config]
                assert estimate.measured
                if "run2" in log.name:  # the slower host (REPORT.md, "H100"): the next test
                    continue
                ratio = result["process_s"] / estimate.seconds(steps)
                assert 0.85 <= ratio <= 1.15, (log.name, config, ratio)
                checked += 1
    assert checked == 5


def test_the_default_benchmark_fits_the_slower_h100_host_too():
    """Each 184m configuration's slowest logged process (either host) fits the benchmark's
    per-process timeout, and all of them together the part's cap."""
    slowest = {}
    for log in H100_LOGS:
        for config, result in json.loads(log.read_text())["sizes"].get("184m", {}).get(
                "results", {}).items():
            slowest[config] = max(slowest.get(config, 0), result["process_s"])
    assert set(slowest) == {"packed", "padded", "reference"}
    (bench,) = [p for p in _plan() if p.name == "benchmark"]
    assert int(bench.command[bench.command.index("--timeout") + 1]) >= max(slowest.values())
    assert bench.cap_s >= sum(slowest.values())


def test_the_cost_estimate_agrees_with_the_logged_184m_measurement():
    # REPORT.md: the 184m cost model (21 packs, 5 reps) took 27 s on the H200.
    assert 0.8 <= gpu_check.cost_seconds("184m", 5) / 27 <= 1.4


def test_the_second_command_runs_its_parts_in_the_order_named(monkeypatch):
    # The GPU machine has pytest-xdist; CI's environment need not (gpu_check then runs serially).
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *rest: (
        object() if name == "xdist" else real_find_spec(name, *rest)))
    parts = _plan("--parts", "suite,cost,benchmark", "--suite", "all", "--cost-size", "1.3b",
                  "--sizes", "2.8b", "--configs", "packed,reference", "--iters", "4")
    assert [p.name for p in parts] == ["suite", "cost", "benchmark"]
    suite, cost, bench = (p.command for p in parts)
    assert suite[1:3] == ["-m", "pytest"] and "tests" in suite and "--ignore=tests/gpu" in suite
    assert suite[suite.index("-n") + 1] == "8" and dict(parts[0].env) == {"OMP_NUM_THREADS": "1"}
    assert bench[bench.index("--sizes") + 1] == "2.8b"
    assert bench[bench.index("--configs") + 1] == "packed,reference"
    assert cost[cost.index("--size") + 1] == "1.3b"


def test_the_exit_code_counts_every_part_that_did_not_pass():
    outcome = lambda status: gpu_check.Outcome("p", status, 1.0, "", 10)  # noqa: E731
    assert gpu_check.exit_code([outcome("ok"), outcome("ok")]) == 0
    assert gpu_check.exit_code([outcome("ok"), outcome("skipped")]) == 1
    assert gpu_check.exit_code([outcome("timeout"), outcome("failed (2)"), outcome("ok")]) == 2
