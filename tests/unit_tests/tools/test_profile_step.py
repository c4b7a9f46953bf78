"""tools/profile_step.py runs end to end on CPU (tiny shape): the step summary, the operator
table and the call-site counts; its GPU numbers come from a GPU session (results/gpu)."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_profile_step_smoke_run_on_cpu():
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "profile_step.py"), "--device",
                           "cpu", "--tiny", "--configs", "packed,reference", "--steps", "1"],
                          capture_output=True, text=True, timeout=240, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for config in ("packed", "reference"):
        assert f"=== {config}: " in proc.stdout and "ms per step" in proc.stdout
        assert f"--- {config}: " in proc.stdout
    assert "megatron/" in proc.stdout  # call sites are named by repository path


def test_megatron_core_rope_switch():
    """``--megatron-core-rope``: the packed step's RoPE is megatron-core's (its call sites show
    up); without it, one table per micro-batch (none of megatron-core's RoPE call sites)."""
    outputs = {}
    for flag in ([], ["--megatron-core-rope"]):
        proc = subprocess.run([sys.executable, str(REPO / "tools" / "profile_step.py"),
                               "--device", "cpu", "--tiny", "--configs", "packed", "--steps",
                               "1", *flag], capture_output=True, text=True, timeout=240,
                              cwd=REPO)
        assert proc.returncode == 0, proc.stderr[-3000:]
        outputs[bool(flag)] = proc.stdout
    assert "rope_utils.py" in outputs[True]
    assert "rope_utils.py" not in outputs[False]
