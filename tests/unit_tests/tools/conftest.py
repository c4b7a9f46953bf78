"""tools/gpu_check.py's CPU dry run, once per session for the tests that read it.

Its cost part is tools/measure_cost_model.py's own CPU smoke run (``--device cpu --tiny --reps
1``): test_measure_cost_model.py reads that part's log and profile instead of starting the tool
a second time (about 25 s of a loaded 2-core machine's suite).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
DRY_RUN_BUDGET_S = 400
DRY_RUN_TIMEOUT_S = 450  # the budget, and the summary's own time


@dataclasses.dataclass(frozen=True)
class DryRun:
    out: Path  # gpu_check's --out: summary.txt, <part>.log, the kept files
    proc: subprocess.CompletedProcess

    def part(self, name: str) -> tuple[str, float]:
        """A part's status (ok, failed (rc), timeout, skipped) and seconds, from summary.txt."""
        lines = (self.out / "summary.txt").read_text().splitlines()[1:]
        words = next(line.split() for line in lines if line.split()[0] == name)
        if words[1] == "failed":  # "failed (rc)"
            return f"{words[1]} {words[2]}", float(words[3])
        return words[1], float(words[2])


@pytest.fixture(scope="session")
def gpu_check_cpu_dry_run(tmp_path_factory) -> DryRun:
    out = tmp_path_factory.mktemp("gpu_check_dry_run")
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "gpu_check.py"), "--device",
                           "cpu", "--out", str(out), "--budget-s", str(DRY_RUN_BUDGET_S)],
                          capture_output=True, text=True, timeout=DRY_RUN_TIMEOUT_S, cwd=REPO)
    return DryRun(out, proc)
