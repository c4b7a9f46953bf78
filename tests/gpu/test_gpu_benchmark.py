"""The GPU benchmark tool runs end to end on CUDA (tiny shape, one NCCL rank; the real run is the
command in README.md), and:

* the forward + backward (with gradient reduction) of every configuration makes no synchronising
  call (profiler events beyond an empty region's);
* a whole step of ours waits for the GPU only where the step's compute is over -- the grad norm
  (megatron-core's ``.item()``) and the loss report -- or before it starts, while building the
  step's batches (the data path's collectives; the GPU is idle then); and our optimizer is
  torch's fused AdamW.

Run with `pytest -m gpu tests/gpu`; skipped without CUDA."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.harness.child_env import gpu_child_env

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

REPO = Path(__file__).resolve().parents[2]
# Where a step may wait once its compute is done: the grad norm the optimizer returns, the loss.
STEP_END_SITES = ("megatron/core/optimizer/clip_grads.py", "megatron/varlen_training/training.py")
# Building the step's batches, before its compute: object and length collectives, reroute.
BATCH_BUILDING_SITES = ("megatron/varlen/packing/data_schedule.py",
                        "megatron/varlen/packing/reroute.py",
                        "megatron/varlen/packing/thd_microbatch.py",
                        "megatron/varlen_training/data.py")


@pytest.mark.timeout(300)  # three fresh processes, one step measured each
def test_tiny_benchmark_runs_all_three_configurations(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "benchmark_gpu.py"), "--tiny", "--iters", "1",
         "--warmup", "1", "--out", str(tmp_path), "--timeout", "90"],
        capture_output=True, text=True, timeout=280, cwd=REPO,
        env=gpu_child_env())  # the suite's children run on CPU unless asked (tests/conftest.py)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "results.json").read_text())
    assert report["device"] == torch.cuda.get_device_name()
    for name in ("packed", "padded", "reference"):
        result = report["sizes"]["tiny"]["results"][name]
        assert result["tokens_per_s"] > 0 and result["peak_memory_gib"] > 0, result
        assert result["syncs_forward_backward"] == 0, (name, result)
        assert result["fused_adam"], (name, result)
    for name in ("packed", "padded"):
        sites = report["sizes"]["tiny"]["results"][name]["sync_sites"]
        assert all(site.startswith(STEP_END_SITES + BATCH_BUILDING_SITES)
                   for site, _ in sites), (name, sites)
        step_end = sum(count for site, count in sites if site.startswith(STEP_END_SITES))
        assert step_end == 2, (name, sites)  # one grad norm, one loss
    assert (tmp_path / "REPORT.md").read_text().startswith("# GPU training benchmark")
