"""tools/profile_step.py runs end to end on CPU (tiny shape): the step summary, the operator
table and the call-site counts; its GPU numbers come from a GPU session (results/gpu).

Two runs: the smoke run (packed and reference, with ``--mm-shapes``) and the packed step with
``--megatron-core-rope``; the smoke run's packed section is the switch's other side (it was a
third run of its own)."""

import collections
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
TIMEOUT_S = 240
TINY_CPU = [sys.executable, str(REPO / "tools" / "profile_step.py"), "--device", "cpu",
            "--tiny", "--steps", "1"]
# The tiny shape's operations are too small to share out: on torch's default of every core a
# run took 11-17 s on the loaded 2-core machine, 7-8 s on one thread, side by side.
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}
RUNS = {"smoke": ["--configs", "packed,reference", "--mm-shapes"],
        "megatron_core_rope": ["--configs", "packed", "--megatron-core-rope"]}


@pytest.fixture(scope="module")
def outputs() -> dict[str, str]:
    """Each run's stdout (each must exit 0)."""
    done = {}
    for name, argv in RUNS.items():
        proc = subprocess.run(TINY_CPU + argv, cwd=REPO, capture_output=True, text=True,
                              timeout=TIMEOUT_S, env=ONE_THREAD)
        assert proc.returncode == 0, (name, proc.stderr[-3000:])
        done[name] = proc.stdout
    return done


def _section(stdout: str, config: str) -> str:
    """One configuration's lines: from its ``=== config:`` line to the next ``=== `` line."""
    start = stdout.index(f"=== {config}: ")
    end = stdout.find("\n=== ", start + 1)
    return stdout[start:] if end < 0 else stdout[start:end]


def test_profile_step_smoke_run_on_cpu(outputs):
    for config in ("packed", "reference"):
        section = _section(outputs["smoke"], config)
        assert "ms per step" in section and f"--- {config}: " in section
    assert "megatron/" in outputs["smoke"]  # call sites are named by repository path


def test_matmuls_by_shape(outputs):
    """``--mm-shapes``: both sides' matrix multiplications by input shape; the tiny model's
    linear layers multiply [tokens, 64] activations by 64-wide weights."""
    for config in ("packed", "reference"):
        section = _section(outputs["smoke"], config)
        table = section[section.index(f"--- {config}: matrix multiplications by input shape"):]
        rows = [line for line in table.splitlines()[1:] if "aten::" in line]
        assert rows and any(", 64]" in row for row in rows), table
    assert "matrix multiplications" not in outputs["megatron_core_rope"]


def test_megatron_core_rope_switch(outputs):
    """``--megatron-core-rope``: the packed step's RoPE is megatron-core's (its file shows up
    among the files making the most calls, whichever sites lead); without it, one table per
    micro-batch (none of megatron-core's RoPE calls)."""
    assert "rope_utils.py" in _section(outputs["megatron_core_rope"], "packed")
    assert "rope_utils.py" not in _section(outputs["smoke"], "packed")


def test_calls_are_summed_by_file():
    from tools.profile_step import calls_by_file

    counts = collections.Counter({("add", "a/b.py:3"): 2, ("mul", "a/b.py:9"): 5,
                                  ("add", "c.py:3"): 4, ("cat", "?"): 1})
    assert calls_by_file(counts) == {"a/b.py": 7, "c.py": 4, "?": 1}
