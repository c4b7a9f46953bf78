"""The processes a test starts run on CPU unless it asks for the GPU (tests/harness/child_env.py).

Each child reports the ``CUDA_VISIBLE_DEVICES`` it got (the independent witness: the child's own
environment, not the launcher's bookkeeping). The launcher is a fresh interpreter that poses as
a pytest process started on a GPU machine (``CUDA_VISIBLE_DEVICES`` set, or unset: all GPUs),
so the session's own state stays untouched. No torch is imported: each process costs an
interpreter start only.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import child_env

REPO = Path(__file__).resolve().parents[3]
UNSET = "unset"

LAUNCHER = f'''
import json, multiprocessing, os, subprocess, sys

SHOW = [sys.executable, "-c",
        "import os; print(os.environ.get('CUDA_VISIBLE_DEVICES', {UNSET!r}))"]


def _child_sees(env=None):
    return subprocess.run(SHOW, env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def _report(queue):
    queue.put(os.environ.get("CUDA_VISIBLE_DEVICES", {UNSET!r}))


def _rank_sees(device):
    from tests.harness import multirank

    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_report, args=(queue,))
    multirank._start([proc], device)
    seen = queue.get(timeout=60)
    proc.join()
    return seen


if __name__ == "__main__":
    from tests.harness import child_env

    minimal = {{"PATH": os.environ["PATH"]}}
    child_env.hide_gpus_from_children()
    seen = {{
        "inherited": _child_sees(),
        "minimal": _child_sees(minimal),
        "explicit": _child_sees({{**minimal, "CUDA_VISIBLE_DEVICES": "1"}}),
        "gpu_child": _child_sees(child_env.gpu_child_env()),
        "gpu_child_minimal": _child_sees(child_env.gpu_child_env(minimal)),
        "cpu_rank": _rank_sees("cpu"),
        "cuda_rank": _rank_sees("cuda"),
        "inherited_after_cuda_rank": _child_sees(),
    }}
    child_env.restore_gpus_for_children()
    seen["restored"] = _child_sees()
    seen["restored_minimal"] = _child_sees(minimal)
    print(json.dumps(seen))
'''


@pytest.mark.parametrize("launcher_sees", ["0,1", UNSET])
def test_children_run_on_cpu_unless_asked(tmp_path, launcher_sees):
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    # The launcher's own visibility is this test's explicit choice (the session would hide).
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), child_env.GPU_CHILD_MARK: "1"}
    if launcher_sees != UNSET:
        env["CUDA_VISIBLE_DEVICES"] = launcher_sees
    done = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "inherited": "", "minimal": "", "explicit": "1", "cpu_rank": "",
        "gpu_child": launcher_sees, "gpu_child_minimal": launcher_sees,
        "cuda_rank": launcher_sees, "inherited_after_cuda_rank": "",
        "restored": launcher_sees, "restored_minimal": UNSET,
    }


def test_this_session_hides_gpus_from_children():
    """tests/conftest.py applies the rule to the whole suite."""
    assert os.environ[child_env.GPU_VISIBILITY] == child_env.HIDDEN
    assert child_env.cpu_default({"PATH": "/bin"}) == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": ""}
    assert child_env.cpu_default(None) is None


def test_own_view_keeps_its_device_count(monkeypatch):
    """torch caches the device count only when it is asked after CUDA initialised, and reads
    the environment until then: the session's own view must ask before the environment hides
    the GPUs (a fake torch.cuda that answers by the environment, as NVML does)."""
    import torch

    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "init", lambda: asked.append("init"))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: asked.append(
        os.environ.get(child_env.GPU_VISIBILITY, UNSET)) or 1)
    monkeypatch.setenv(child_env.GPU_VISIBILITY, "0,1")
    child_env._fix_own_cuda_view()
    assert asked == ["init", "0,1"]
