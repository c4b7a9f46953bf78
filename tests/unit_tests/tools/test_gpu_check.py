"""tools/gpu_check.py: the CPU dry run of the whole check (so it cannot rot between GPU
sessions), and the runner's deadline, timeout and output rules on tiny fake parts."""

import importlib.util
import json
import re
import sys
import time
from pathlib import Path

import pytest

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

H100 = REPO / "results" / "gpu" / "h100"
H100_LOGS = sorted(H100.glob("run*_benchmark_*.json"))
# The slow host's make gpu-check (2026-11-27): its part times and its benchmark log.
SLOW_HOST_SUMMARY = H100 / "run4_gpu_check_summary.txt"
SLOW_HOST_BENCHMARK_LOG = H100 / "run4_benchmark_184m.log"
# The benchmark JSON files the slower hosts wrote (REPORT.md: their reference steps took
# 0.225 s and more against 0.191-0.199 s on the faster host).
SLOW_HOST_RUNS = ("run2_", "run6_")


def _plan(*argv: str) -> list:
    cli = gpu_check._parse(list(argv))
    return gpu_check._select(gpu_check.plan_parts(cli, Path("/scratch")), cli.parts)


def test_the_default_plan_gives_every_part_time_inside_the_budget():
    parts = _plan()
    assert [p.name for p in parts] == PART_ORDER
    caps = sum(p.cap_s for p in parts) + gpu_check.INSTALL_ALLOWANCE_S
    assert caps <= gpu_check.DEFAULT_BUDGET_S, [(p.name, p.cap_s) for p in parts]
    for part in parts:  # a margin over the expected time
        assert part.cap_s >= 1.1 * part.expected_s > 0, part
    assert "fit the 480 s budget" in gpu_check.plan_lines(parts, gpu_check.DEFAULT_BUDGET_S)[-1]


def _logged_part_seconds() -> dict[str, float]:
    rows = [line.split() for line in SLOW_HOST_SUMMARY.read_text().splitlines()[1:]]
    return {row[0]: float(row[2]) for row in rows if row[1] == "ok"}


def test_the_default_plan_is_the_slow_hosts_logged_part_times():
    """Each part that passed on the slow host (its summary table) is expected within 10% of what
    it took there, and its cap covers that."""
    logged = _logged_part_seconds()
    assert set(logged) == {"probe", "cost", "gpu_tests", "suite"}
    for part in _plan():
        if part.name in logged:
            assert 0.9 <= part.expected_s / logged[part.name] <= 1.1, (part, logged)
            assert part.cap_s >= logged[part.name], (part, logged)


def test_the_test_parts_name_failures_as_they_happen():
    for part in _plan():
        if part.name in ("gpu_tests", "suite"):
            assert part.command[part.command.index("tools.pytest_failures_now") - 1] == "-p"


def test_a_plan_over_its_budget_says_so_before_it_starts():
    parts = _plan("--parts", "benchmark", "--sizes", "184m,1.3b,2.8b")
    assert sum(p.cap_s for p in parts) > 300
    assert "EXCEED" in gpu_check.plan_lines(parts, 300)[-1]


def test_the_benchmark_estimate_agrees_with_the_logged_h100_processes():
    """The faster host's logged H100 benchmark processes (results/gpu/h100, its commands 1 and
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
                if log.name.startswith(SLOW_HOST_RUNS):  # slower hosts: the next test
                    continue
                ratio = result["process_s"] / estimate.seconds(steps)
                assert 0.85 <= ratio <= 1.15, (log.name, config, ratio)
                checked += 1
    assert checked == 5


def _logged_184m_processes() -> list[dict[str, dict]]:
    """Each logged 184m benchmark command's results: the JSON files, and the slow host's log
    (one ``184m <config>: {...}`` line per configuration, as tools/benchmark_gpu.py prints)."""
    runs = [json.loads(log.read_text())["sizes"].get("184m", {}).get("results", {})
            for log in H100_LOGS]
    lines = [line.split(": ", 1) for line in SLOW_HOST_BENCHMARK_LOG.read_text().splitlines()
             if line.startswith("184m ")]
    return [*runs, {head.split()[1]: json.loads(body) for head, body in lines}]


def _timeouts(bench) -> dict[str, int]:
    text = bench.command[bench.command.index("--timeout") + 1]
    return {config: int(s) for config, s in (item.split("=") for item in text.split(","))}


def test_the_benchmark_plan_covers_the_slow_hosts_processes():
    """Every logged 184m process (both hosts) fits its configuration's timeout; padded, cut at
    60 s on the slow host, gets what the faster host's padded took times that host's slowdown
    (its packed over the faster host's, same steps); all of them fit the part's cap."""
    (*_, slow), fast = _logged_184m_processes(), json.loads(H100_LOGS[0].read_text())
    assert "run1" in H100_LOGS[0].name and slow["padded"] == {"error": "timed out after 60 s"}
    fast = fast["sizes"]["184m"]["results"]
    slowdown = slow["packed"]["process_s"] / fast["packed"]["process_s"]
    slow_estimate = {config: fast[config]["process_s"] * slowdown for config in fast}
    assert slow_estimate["padded"] > 75  # the padded process the slow host could not finish
    (bench,) = [p for p in _plan("--configs", "packed,padded,reference") if p.name == "benchmark"]
    timeouts = _timeouts(bench)
    assert list(timeouts) == ["packed", "reference", "padded"]  # the order they run in
    for run in _logged_184m_processes():
        for config, result in run.items():
            if "process_s" in result:
                assert timeouts[config] >= result["process_s"], (config, result, timeouts)
    for config, seconds in slow_estimate.items():
        assert timeouts[config] >= seconds, (config, seconds, timeouts)
    assert bench.cap_s >= sum(slow_estimate.values())
    (default,) = [p for p in _plan() if p.name == "benchmark"]
    assert default.cap_s >= slow_estimate["packed"] + slow_estimate["reference"]


def test_the_cost_estimate_covers_the_logged_184m_measurements():
    # REPORT.md: the 184m cost model (21 packs, 5 reps) took 27 s on the H200; the slow H100
    # host's (its summary table) is the other.
    expected = gpu_check.cost_seconds("184m", 5)
    assert 27 <= expected and 0.9 <= expected / _logged_part_seconds()["cost"] <= 1.1
    # Larger models take longer by the model's pack count and step times (same reps).
    assert gpu_check.cost_seconds("1.3b", 5) > 2 * expected


@pytest.fixture
def with_xdist(monkeypatch):
    # The GPU machine has pytest-xdist; CI's environment need not (gpu_check then runs serially).
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *rest: (
        object() if name == "xdist" else real_find_spec(name, *rest)))


def test_parts_run_in_the_order_named(with_xdist):
    parts = _plan("--parts", "suite,cost,benchmark", "--suite", "all2", "--cost-size", "1.3b",
                  "--sizes", "2.8b", "--configs", "reference,packed", "--iters", "4")
    assert [p.name for p in parts] == ["suite", "cost", "benchmark"]
    suite, cost, bench = (p.command for p in parts)
    assert suite[1:3] == ["-m", "pytest"] and "tests/unit_tests/varlen_training" in suite
    assert suite[suite.index("-n") + 1] == "8" and dict(parts[0].env) == {"OMP_NUM_THREADS": "1"}
    assert bench[bench.index("--sizes") + 1] == "2.8b"
    assert list(_timeouts(parts[2])) == ["packed", "reference"]
    assert cost[cost.index("--size") + 1] == "1.3b"


# make gpu-check's cut run of the whole suite: its cap (the lead's note of run 5), its log's last
# progress mark.
SUITE_CUT_AT_S = 312
DEVICE_COMMAND_S = 600


def test_the_whole_suite_runs_in_two_halves_that_each_fit_one_device_command(with_xdist):
    """At the cut run's rate the whole suite with its margin does not fit one 600 s command;
    each half does (with the install), and together they are the whole suite."""
    marks = re.findall(r"\[\s*(\d+)%\]", (H100 / "run5_suite_all_timeout.log").read_text())
    whole_s = SUITE_CUT_AT_S / (max(int(mark) for mark in marks) / 100)
    assert whole_s * gpu_check.CAP_MARGIN + gpu_check.INSTALL_ALLOWANCE_S > DEVICE_COMMAND_S
    halves = [_plan("--parts", "suite", "--suite", half)[0] for half in ("all1", "all2")]
    assert sum(half.expected_s for half in halves) >= 0.95 * whole_s
    for half in halves:
        assert half.cap_s + gpu_check.INSTALL_ALLOWANCE_S <= DEVICE_COMMAND_S, half
    first, second = (half.command for half in halves)
    ignored = {arg.split("=", 1)[1] for arg in first if arg.startswith("--ignore=")}
    second_folders = {arg for arg in second if arg.startswith("tests/")}
    assert "tests" in first and ignored == {"tests/gpu", *second_folders}
    test_files = {path.relative_to(REPO).as_posix() for path in (REPO / "tests").rglob("test_*.py")}
    assert all(any(f.startswith(folder + "/") for f in test_files) for folder in second_folders)
    (whole,) = _plan("--parts", "suite", "--suite", "all")
    assert "tests" in whole.command
    assert [arg for arg in whole.command if arg.startswith("--ignore=")] == ["--ignore=tests/gpu"]


def test_both_halves_run_one_after_the_other_into_one_log(with_xdist):
    """``--suite all1,all2``: the two halves' own commands, in that order, under ``--parts
    suite``, writing one suite.log (the files back from a device command stay <= 8)."""
    halves = _plan("--parts", "suite", "--suite", "all1,all2")
    alone = [_plan("--parts", "suite", "--suite", half)[0] for half in ("all1", "all2")]
    assert [p.name for p in halves] == ["suite_all1", "suite_all2"]
    assert [p.command for p in halves] == [p.command for p in alone]
    assert [p.cap_s for p in halves] == [p.cap_s for p in alone]
    assert {p.log_name for p in halves} == {"suite.log"} == {alone[0].log_name}
    every = _plan("--suite", "all1,all2")
    assert len({p.log_name for p in every}) + len(
        [name for p in every for _, name in p.keep]) + 1 <= MAX_FILES_BACK  # + summary.txt
    with pytest.raises(SystemExit):
        _plan("--suite", "all1,half3")


def test_an_appended_log_keeps_the_earlier_parts_output(tmp_path):
    first, second = (gpu_check.Part(name, 10, [sys.executable, "-c", f"print({name!r})"],
                                    log="suite") for name in ("suite_all1", "suite_all2"))
    deadline = time.monotonic() + 30
    gpu_check.run_part(first, deadline, tmp_path, gpu_check._env())
    outcome = gpu_check.run_part(second, deadline, tmp_path, gpu_check._env(), append=True)
    assert outcome.status == "ok" and outcome.detail == "suite_all2"
    assert (tmp_path / "suite.log").read_text().split() == [
        "suite_all1", "===", "suite_all2", "suite_all2"]


def test_the_exit_code_counts_every_part_that_did_not_pass():
    outcome = lambda status: gpu_check.Outcome("p", status, 1.0, "", 10)  # noqa: E731
    assert gpu_check.exit_code([outcome("ok"), outcome("ok")]) == 0
    assert gpu_check.exit_code([outcome("ok"), outcome("skipped")]) == 1
    assert gpu_check.exit_code([outcome("timeout"), outcome("failed (2)"), outcome("ok")]) == 2
