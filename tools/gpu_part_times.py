"""How long each part of the GPU check takes on one H100: what the GPU sessions logged, and
estimates (marked) for what never ran. tools/gpu_check.py plans its caps from these, so a
default ``make gpu-check`` gives every part time inside its 480 s budget.

Sources: ``results/gpu/h100/run*_benchmark_*.json`` (``process_s`` of each benchmark process,
H100 commands 1 and 3), ``results/gpu/REPORT.md`` (the part times of the H200 runs: probe 31 s,
``pytest -m gpu tests/gpu -n 4`` 128 s, the 184m cost model 27 s), and the suite's per-test
durations on CPU (``pytest -n 2 --durations=0``; how they scale: the suite's comment below).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ProcessTime:
    """One benchmark process: start-up (imports, model build, moving it to the GPU, the first
    kernels) and one training step of the global batch (32 samples, ~35k tokens)."""

    startup_s: float
    step_s: float
    measured: bool

    def seconds(self, steps: int) -> float:
        return self.startup_s + self.step_s * steps


# process_s minus its steps (warm-up + measured + the profiled ones): 184m packed 27.7 s for 13
# steps of 0.19 s, padded 45.5 s / 0.75 s, reference 20.5 s / 0.19 s; 1.3b packed 69.4 s for 9
# steps of 0.74 s, reference 35.9 s / 0.88 s. Not measured (estimates): start-up grows ~35 s
# per billion parameters for ours and ~10 s for the reference (184m -> 1.3b); a step grows with
# the parameters (1.27B -> 2.6B: x2.05); padded steps take 4x packed ones (184m: 0.75 / 0.19).
BENCHMARK_PROCESS = {
    ("184m", "packed"): ProcessTime(25.0, 0.19, measured=True),
    ("184m", "padded"): ProcessTime(36.0, 0.75, measured=True),
    ("184m", "reference"): ProcessTime(18.0, 0.19, measured=True),
    ("1.3b", "packed"): ProcessTime(63.0, 0.74, measured=True),
    ("1.3b", "padded"): ProcessTime(75.0, 2.9, measured=False),
    ("1.3b", "reference"): ProcessTime(29.0, 0.88, measured=True),
    ("2.8b", "packed"): ProcessTime(110.0, 1.5, measured=False),
    ("2.8b", "padded"): ProcessTime(120.0, 6.0, measured=False),
    ("2.8b", "reference"): ProcessTime(42.0, 1.8, measured=False),
}
# Steps a benchmark process runs besides warm-up and measured ones: a profiled forward+backward,
# a profiled step and the step whose sync sites are listed (tools/benchmark_gpu.py).
BENCHMARK_EXTRA_STEPS = 3

# The cost model (tools/measure_cost_model.py): our start-up as above, then every pack forward +
# backward (2 warm-ups + reps). A pack costs its tokens at the step's rate per token plus the
# per-micro-batch constant the H200 fit found (gamma = 24 ms at 184m, host-bound). The 184m
# estimate (32 s) matches the 27 s the H200 took.
COST_PACK_OVERHEAD_S = 0.024
STEP_TOKENS = 35_000  # tokens of one benchmark step (global batch 32, mean length ~1,100)

# Fixed parts, on one H100 (H200 logs; the H100 ran tests/gpu in under its 150 s cap).
PROBE_S = 35.0
GPU_TESTS_S = 130.0

# The suite with CUDA visible, from its per-test durations on CPU (``pytest -n 2 --durations=0``,
# a shared 2-core machine). With each worker on one torch thread (tests/conftest.py) at load
# 4-10: 2,276 passed in 15 minutes, 1,753 s of test time. 1.8 processes per busy worker on
# average (72% of the time is in tests that start 2-4 ranks or subprocesses, one thread each):
# on 16 cores, 8 workers keep ~14 processes busy, none starved; 1,753 / 8 + 20 s of worker
# start-up = ~240 s, if a process there runs as fast as here (an estimate: the GPU run's suite
# log lists its slowest tests). (An earlier run at load 14-20, each worker on every core's
# threads: 3,718 s of test time, the position-table fuzz past its 600 s timeout.) The subset
# (gpu_check.CUDA_SENSITIVE_TESTS) is bound by its start-up and longest test, not by its total:
# 33 s with 2 workers on this machine at load 2; the H200 ran a larger one (+ the cost model's
# CPU smoke test, 50 s here) in ~80 s with CUDA visible.
SUITE_ALL_WORKERS = 8
SUITE_SUBSET_WORKERS = 8
SUITE_ALL_S = 240.0
SUITE_SUBSET_S = 55.0
# tests/gpu as the H200 and H100 ran it.
GPU_TESTS_WORKERS = 4
