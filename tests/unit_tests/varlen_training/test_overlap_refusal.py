"""--overlap-grad-reduce / --overlap-param-gather on CUDA ranks over gloo (ranks sharing a GPU):
gloo reduces CUDA gradients one bucket at a time, synchronously (gloo_cuda.py), so the overlap
cannot work. It used to fail at the first gradient reduction with a traceback; now start-up
refuses it in one line, exit code 2. The facts (device, backend) are values, so CPU tests can
ask about CUDA; the end-to-end test makes only gloo_cuda's view of the device say CUDA."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from megatron.varlen.platform import gloo_cuda

REPO = Path(__file__).resolve().parents[3]
GRAD, PARAM = "--overlap-grad-reduce", "--overlap-param-gather"


def _expected(named: str) -> str:
    return (f"{named} cannot run on CUDA ranks over gloo (ranks sharing a GPU): gloo reduces "
            f"CUDA gradients one bucket at a time, synchronously, so nothing overlaps; drop "
            f"{named}, or run one rank per GPU (NCCL)")


@pytest.mark.parametrize("on_cuda, backend, grad, param, expected", [
    (True, "gloo", True, False, _expected(GRAD)),
    (True, "gloo", False, True, _expected(PARAM)),
    (True, "gloo", True, True, _expected(f"{GRAD} and {PARAM}")),
    (True, "gloo", False, False, None),  # no overlap asked for: one bucket at a time is fine
    (True, "nccl", True, True, None),  # NCCL overlaps (real multi-GPU runs)
    (False, "gloo", True, True, None),  # CPU ranks over gloo overlap (test_overlap.py)
])
def test_refused_exactly_for_cuda_over_gloo(on_cuda, backend, grad, param, expected):
    assert gloo_cuda.overlap_refusal(on_cuda, backend, grad, param) == expected


RUN_AS_IF_ON_CUDA = textwrap.dedent("""
    import runpy, sys
    from megatron.varlen.platform import gloo_cuda
    gloo_cuda.trains_on_cuda = lambda: True  # the device fact only; the ranks stay on CPU
    sys.argv = ["pretrain_gpt.py", *sys.argv[1:]]
    runpy.run_path("pretrain_gpt.py", run_name="__main__")
""")
TINY = ["--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2",
        "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "2",
        "--lr", "1e-3", "--train-iters", "1", "--eval-iters", "0", "--mock-data",
        "--tokenizer-type", "NullTokenizer", "--vocab-size", "64"]


def test_pretrain_refuses_at_start_up_in_one_line():
    proc = subprocess.run(
        [sys.executable, "-c", RUN_AS_IF_ON_CUDA, *TINY, GRAD, PARAM,
         "--use-distributed-optimizer"],
        capture_output=True, text=True, timeout=120, cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore",
             "CUDA_VISIBLE_DEVICES": ""})
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert lines == [f"pretrain_gpt.py: error: {_expected(f'{GRAD} and {PARAM}')}"]
    assert "iteration" not in proc.stdout  # refused before training, not during it
