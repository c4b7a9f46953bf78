"""The GPU benchmark tool runs end to end on CUDA (tiny shape; the real run is the command in
README.md), and the forward/backward of every configuration makes no synchronising copy (the
issue's target; the whole step may: loss and grad-norm reports). Run with
`pytest -m gpu tests/gpu`; skipped without CUDA."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(1800)  # three fresh processes, each compiling its kernels once
def test_tiny_benchmark_runs_all_three_configurations(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "benchmark_gpu.py"), "--tiny", "--iters", "2",
         "--warmup", "1", "--out", str(tmp_path), "--timeout", "500"],
        capture_output=True, text=True, timeout=1700, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "results.json").read_text())
    assert report["device"] == torch.cuda.get_device_name()
    for name in ("packed", "padded", "reference"):
        result = report["results"][name]
        assert result["tokens_per_s"] > 0 and result["peak_memory_gib"] > 0, result
        assert result["syncs_forward_backward"] == 0, (name, result)
    assert (tmp_path / "REPORT.md").read_text().startswith("# GPU training benchmark")
