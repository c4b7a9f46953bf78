"""tools/pytest_failures_now.py: a run killed before its end summary has already named each
failing test (node id and reason) in its log, with and without pytest-xdist."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
WAIT_S = 60  # for the lines to appear; the fake run itself would hang for HANG_S
HANG_S = 120
FAILING = '''
import pytest

@pytest.fixture
def broken():
    raise RuntimeError("the fake fixture broke")

def test_passes():
    pass

def test_fails():
    assert 1 == 2, "the fake failure"

def test_errors(broken):
    pass
'''
HANGING = f"import time\n\ndef test_hangs():\n    time.sleep({HANG_S})\n"
EXPECTED = ("FAILED test_a.py::test_fails - AssertionError: the fake failure",
            "ERROR test_a.py::test_errors - RuntimeError: the fake fixture broke")


def _run_until_named(tmp_path: Path, *options: str) -> str:
    """Runs the fake tests (the failing file, then a hanging one) until the log names both
    failures, kills the run, and returns the log; fails if pytest had already ended."""
    (tmp_path / "test_a.py").write_text(FAILING)
    (tmp_path / "test_b.py").write_text(HANGING)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
    log = tmp_path / "log.txt"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "tools.pytest_failures_now",
               "-p", "no:randomly", "-p", "no:cacheprovider", *options, "test_a.py", "test_b.py"]
    with open(log, "w") as out:
        proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + WAIT_S
        while (not all(line in log.read_text() for line in EXPECTED) and proc.poll() is None
               and time.monotonic() < deadline):
            time.sleep(0.1)
        still_running = proc.poll() is None
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # pytest and its workers
        proc.wait()
    text = log.read_text()
    assert still_running, text
    return text


def _assert_named_once(text: str) -> None:
    for line in EXPECTED:
        assert text.count(f"\n{line}\n") == 1, text  # a line of its own, once
    assert "test_passes" not in text and "test_hangs" not in text, text


def test_a_killed_run_has_already_named_its_failures(tmp_path):
    _assert_named_once(_run_until_named(tmp_path))


def test_under_xdist_the_controller_names_them_once(tmp_path):
    pytest.importorskip("xdist", reason="pytest-xdist is not installed (the GPU machine has it)")
    # One file per worker: the failing file does not wait behind the hanging one.
    _assert_named_once(_run_until_named(tmp_path, "-n", "2", "--dist", "loadfile"))
