"""tools/read_agreement_cost.py runs on 2 CPU ranks and reports the data path with and without
the read agreement, and the all-reduce it adds; the agreement is put back afterwards."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
KEYS = {"ranks", "rounds", "samples_per_step", "step_agreed_ms", "step_direct_ms",
        "difference_ms", "all_reduce_ms"}


def test_read_agreement_cost_two_rounds(tmp_path):
    out = tmp_path / "cost.json"
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "read_agreement_cost.py"),
                           "--rounds", "2", "--samples", "8", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "the all-reduce alone" in proc.stdout
    result = json.loads(out.read_text())
    assert set(result) == KEYS
    assert result["ranks"] == 2 and result["rounds"] == 2 and result["samples_per_step"] == 8
    assert all(result[key] > 0 for key in ("step_agreed_ms", "step_direct_ms", "all_reduce_ms"))
