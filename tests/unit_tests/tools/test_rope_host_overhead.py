"""tools/rope_host_overhead.py runs on CPU and shows what it is for: one attention layer's aten
ops stay the same whatever the number of sequences with one RoPE table per micro-batch, and grow
with megatron-core's RoPE."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_rope_host_overhead_one_round(tmp_path):
    out = tmp_path / "rope.json"
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "rope_host_overhead.py"),
                           "--rounds", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| sequences | one table ms |" in proc.stdout
    rows = json.loads(out.read_text())
    one_table = {row["layer_ops"]["one table"] for row in rows}
    megatron_core = [row["layer_ops"]["megatron-core"] for row in rows]
    assert len(one_table) == 1, one_table
    assert megatron_core == sorted(megatron_core) and megatron_core[0] < megatron_core[-1]
    assert all(row["layer_ops"]["one table scalar reads"] == 0 for row in rows)
