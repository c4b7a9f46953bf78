"""Latency gate of default_dynamic_cp: 4,096 sequences on 64 ranks (the 10 ms target's scale),
every benchmark workload, best of a few calls in CPU time of this thread.

The bound is generous (GATE_MS, 2.5x the target) so a shared, noisy machine does not fail it,
yet it catches a lost order of magnitude (a quadratic loop, a per-sequence numpy call). The
targets themselves are checked side by side with a baseline tree in one run:
``tools/compare_scheduler_latency.py --old TREE --gate`` (exit 1 if a target is missed). A
future fast path enters behind the same signature and must pass this gate, that comparison and
the same-schedules check (test_sched_same_schedules.py)."""

import pytest

from megatron.varlen.scheduling import CostModel
from tools.scheduling.benchmark import WORKLOADS, make_problem, sample_batches, timed_schedule

TARGET_MS = 10.0
GATE_MS = 2.5 * TARGET_MS
NUM_RANKS, SEQUENCES_PER_RANK = 64, 64
REPEATS = 5


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda workload: workload.name)
def test_latency_at_4096_sequences_on_64_ranks(workload):
    (lengths,) = sample_batches(workload, NUM_RANKS * SEQUENCES_PER_RANK, 1, seed=1)
    problem = make_problem(workload, lengths, NUM_RANKS, CostModel())
    _, _, cpu_ms = timed_schedule(problem, "default_dynamic_cp", REPEATS)
    assert cpu_ms <= GATE_MS, f"{workload.name}: {cpu_ms:.1f} ms (target {TARGET_MS} ms)"
