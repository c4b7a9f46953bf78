"""How long each part of the GPU check takes on one H100: what the GPU sessions logged, and
estimates (marked) for what never ran. tools/gpu_check.py plans its caps from these, so a
default ``make gpu-check`` gives every part time inside its 480 s budget.

The plan is for the slowest H100 host logged so far (results/gpu/h100/run4_*, 2026-11-27: its
184m packed step 1.7x the other host's): a part's cap is its time there plus a margin for noise.

Sources: ``results/gpu/h100/run*_benchmark_*`` (``process_s`` of each benchmark process),
``results/gpu/h100/run4_gpu_check_summary.txt`` (each part of ``make gpu-check`` on the slow
host), ``results/gpu/h100/run5_suite_all_timeout.log`` (the whole suite, cut at 58%),
``results/gpu/REPORT.md`` (the H200 runs).
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


# The faster H100 host's processes (results/gpu/h100/run1, run3): process_s minus its steps
# (warm-up + measured + the profiled ones): 184m packed 27.7 s for 13 steps of 0.19 s, padded
# 45.5 s / 0.75 s, reference 20.5 s / 0.19 s; 1.3b packed 69.4 s for 9 steps of 0.74 s,
# reference 35.9 s / 0.88 s. Not measured (estimates): start-up grows ~35 s per billion
# parameters for ours and ~10 s for the reference (184m -> 1.3b); a step grows with the
# parameters (1.27B -> 2.6B: x2.05); padded steps take 4x packed ones (184m: 0.75 / 0.19).
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

# The slow host (results/gpu/h100/run4_benchmark_184m.log): 184m packed took 47.6 s for 13 steps
# (step 0.34 s), the table's 27.5 s times this. Every benchmark process is planned at it: padded
# ~79 s there (cut at 60 s in that run), the reference ~35 s. Larger models are less host-bound
# (1.3b's step: 392 TFLOP/s), so for them it over-estimates: their caps are generous.
SLOW_HOST_184M_PACKED_S, SLOW_HOST_184M_PACKED_STEPS = 47.6, 13
SLOW_HOST_FACTOR = SLOW_HOST_184M_PACKED_S / BENCHMARK_PROCESS["184m", "packed"].seconds(
    SLOW_HOST_184M_PACKED_STEPS)


def benchmark_seconds(size: str, config: str, steps: int) -> float:
    """Expected seconds of one benchmark process on the slow host."""
    return BENCHMARK_PROCESS[size, config].seconds(steps) * SLOW_HOST_FACTOR


# The cost model (tools/measure_cost_model.py): our start-up as above, then every pack forward +
# backward (2 warm-ups + reps). A pack costs its tokens at the step's rate per token plus the
# per-micro-batch constant the H200 fit found (gamma = 24 ms at 184m, host-bound). From the
# faster host's table that gives 36 s at 184m (the H200 took 27 s); the slow host took 43 s
# (run4_cost.log), the factor gpu_check scales every size's estimate by.
COST_PACK_OVERHEAD_S = 0.024
STEP_TOKENS = 35_000  # tokens of one benchmark step (global batch 32, mean length ~1,100)
SLOW_HOST_COST_184M_S = 43.0

# Fixed parts on the slow host (run4_gpu_check_summary.txt; the H200 took 31 s and 128 s).
PROBE_S = 37.0
GPU_TESTS_S = 157.0
# tests/gpu as the H200 and H100 ran it.
GPU_TESTS_WORKERS = 4

# The CUDA-sensitive subset (gpu_check.CUDA_SENSITIVE_TESTS) with 8 workers: 65 s on the slow
# host (run4_suite_subset.log), bound by its longest tests (the harness's, 38 s), not its total.
SUITE_SUBSET_WORKERS = 8
SUITE_SUBSET_S = 65.0

# The whole suite with CUDA visible (but tests/gpu) reached 58% of its 4,217 tests in 312 s with 8
# workers on 16 cores (run5_suite_all_timeout.log): ~540 s in all at that rate, over one 600 s
# device command with the wheel install and a margin. So it runs in two halves by folder
# (gpu_check.SUITE_HALVES), estimated by their test counts at that rate (20 s of worker start
# each): the first (1,805 tests, before the cut in collection order) ~235 s, the second
# (2,412) ~310 s.
# Workers: 8 of 16 cores, since 72% of the suite's time is in tests that start 2-4 ranks or
# subprocesses (one torch thread each): more workers would oversubscribe the cores there, and
# ranks that wait on each other slow down most under load.
SUITE_ALL_WORKERS = 8
SUITE_RATE_TESTS_PER_S = 0.58 * 4217 / (312 - 20)
SUITE_WORKER_START_S = 20.0
SUITE_TESTS = {"all1": 1805, "all2": 2412, "all": 4217}  # pytest --collect-only, 2026-11-27


def suite_seconds(tests: int) -> float:
    """Expected seconds of ``tests`` of the suite with CUDA visible (8 workers, the slow host)."""
    return SUITE_WORKER_START_S + tests / SUITE_RATE_TESTS_PER_S
