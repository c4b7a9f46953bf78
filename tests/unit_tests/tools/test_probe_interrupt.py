"""An interrupted tools/probe_combinations.py leaves no process behind.

The probe launches its cells through tests/harness/multirank.py: a forkserver (and
multiprocessing's resource tracker) that the probe starts, and rank processes the forkserver
forks. A normal exit ends them all. Killed, the probe used to leave the forkserver and the
ranks running: every rank holds the forkserver's "clients are gone" pipe open, and each rank
watched only its parent, the forkserver. SIGTERM now unwinds through the harness's clean-up
as Ctrl-C (SIGINT) always did (``reap_runs_on_sigterm``: SystemExit instead of
KeyboardInterrupt through the same ``finally``; exit code 143); SIGKILL, which nothing can
catch, ends the probe on the spot and the ranks notice their launcher is gone
(``multirank._exit_when_orphaned``). Each case costs a probe's start-up and the forkserver's
preload (10 s on an idle machine): SIGINT, the path every test's Ctrl-C takes, is left out.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness.multirank import ORPHAN_POLL_S, SIGNAL_EXIT_BASE, process_alive

REPO = Path(__file__).resolve().parents[3]
CELL = "dense/u_dp2"  # its reference (one rank) runs first: the signal comes during it
RANK_START_DEADLINE_S = 180  # probe start-up and the forkserver's preload, on a loaded machine
PROBE_EXIT_DEADLINE_S = 60
# The ranks poll for their launcher every ORPHAN_POLL_S; then the forkserver and the resource
# tracker see their last client go. Generous: a loaded 2-core machine schedules late.
CLEAN_UP_DEADLINE_S = ORPHAN_POLL_S + 20
POLL_S = 0.05
# How the probe ends (subprocess reports a process a signal ended as minus the signal).
EXIT_CODES = {signal.SIGTERM: SIGNAL_EXIT_BASE + signal.SIGTERM, signal.SIGKILL: -signal.SIGKILL}


def _children() -> dict[int, list[int]]:
    """Every process's children, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # ended meanwhile
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])  # after "pid (comm) state"
        children.setdefault(parent, []).append(int(entry.name))
    return children


def _descendants(pid: int) -> dict[int, int]:
    """pid -> depth below ``pid`` (1: the forkserver and the resource tracker; 2: ranks)."""
    children, found, todo = _children(), {}, [(pid, 0)]
    while todo:
        parent, depth = todo.pop()
        for child in children.get(parent, []):
            found[child] = depth + 1
            todo.append((child, depth + 1))
    return found


def _wait_for_a_rank(probe: subprocess.Popen) -> set[int]:
    """Every process the probe has started, once a rank runs (a forkserver's child)."""
    deadline = time.monotonic() + RANK_START_DEADLINE_S
    while time.monotonic() < deadline and probe.poll() is None:
        found = _descendants(probe.pid)
        if any(depth >= 2 for depth in found.values()):
            return set(found)
        time.sleep(POLL_S)
    raise AssertionError(f"no rank started within {RANK_START_DEADLINE_S} s "
                         f"(probe exit code {probe.poll()})")


def _survivors(pids: set[int]) -> set[int]:
    deadline = time.monotonic() + CLEAN_UP_DEADLINE_S
    while any(process_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    return {pid for pid in pids if process_alive(pid)}


@pytest.mark.parametrize("stop", list(EXIT_CODES),
                         ids=lambda stop: stop.name)
def test_a_probe_stopped_by_a_signal_leaves_no_process_behind(tmp_path, stop):
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"}
    log = tmp_path / "probe.log"  # a file, not a pipe: a survivor would hold a pipe open
    with log.open("w") as out:
        probe = subprocess.Popen([sys.executable, "tools/probe_combinations.py", CELL,
                                  "--results", str(tmp_path / "results.jsonl")], cwd=REPO,
                                 env=env, stdout=out, stderr=subprocess.STDOUT)
    started: set[int] = set()
    try:
        started = _wait_for_a_rank(probe)
        probe.send_signal(stop)
        probe.wait(timeout=PROBE_EXIT_DEADLINE_S)
        assert probe.returncode == EXIT_CODES[stop], log.read_text()[-2000:]
        survivors = _survivors(started)
        assert not survivors, f"still running after {stop.name}: {sorted(survivors)}"
    finally:
        for pid in [probe.pid, *started]:  # whatever the outcome, the suite goes on clean
            if process_alive(pid):
                os.kill(pid, signal.SIGKILL)
        probe.wait()
