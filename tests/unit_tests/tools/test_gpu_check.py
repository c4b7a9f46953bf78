"""tools/gpu_check.py: the CPU dry run of the whole check (so it cannot rot between GPU
sessions), and the runner's deadline, timeout and output rules on tiny fake parts."""

import json
import subprocess
import sys
import time
from pathlib import Path

from tools import gpu_check

REPO = Path(__file__).resolve().parents[3]
MAX_FILES_BACK = 8  # what a GPU command brings back from $OUT


def test_cpu_dry_run_runs_every_part(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "gpu_check.py"), "--device",
                           "cpu", "--out", str(tmp_path), "--budget-s", "400"],
                          capture_output=True, text=True, timeout=450, cwd=REPO)
    summary = (tmp_path / "summary.txt").read_text()
    rows = {line.split()[0]: line for line in summary.splitlines()[1:]}
    assert list(rows) == ["probe", "gpu_tests", "benchmark", "cost", "suite"], summary
    for name in ("probe", "gpu_tests", "benchmark", "suite"):
        assert rows[name].split()[1] == "ok", (name, summary, proc.stdout[-3000:])
    # CPU timings of a tiny model are mostly overhead: the fit may be refused, in one line.
    assert rows["cost"].split()[1] == "ok" or "the fit gave" in rows["cost"], summary
    assert proc.returncode == (0 if rows["cost"].split()[1] == "ok" else 1)
    assert "=== summary" in proc.stdout
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) <= MAX_FILES_BACK and "benchmark.json" in files, files
    assert set(json.loads((tmp_path / "benchmark.json").read_text())["sizes"]) == {"tiny"}
    assert "[PASS] gloo" in (tmp_path / "probe.log").read_text()


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


def test_kept_files_are_copied_under_their_names(tmp_path):
    made = tmp_path / "made.json"
    part = gpu_check.Part("writer", 10, [sys.executable, "-c",
                                         f"open({str(made)!r}, 'w').write('{{}}')"],
                          keep=((str(made), "kept.json"),))
    out = tmp_path / "out"
    out.mkdir()
    assert gpu_check.run_part(part, time.monotonic() + 20, out, gpu_check._env()).status == "ok"
    assert (out / "kept.json").read_text() == "{}"
