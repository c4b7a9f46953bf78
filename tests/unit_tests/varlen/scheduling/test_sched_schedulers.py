"""Scheduler behaviour: validity, the issue's named cases, determinism, never worse."""

import json
import os
import random
import subprocess
import sys

import pytest

from megatron.varlen.scheduling import (
    CostModel,
    ScheduleProblem,
    critical_path,
    get_scheduler,
    idle_rank_slots,
    validate_schedule,
)

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
SCHEDULERS = ("dp_balanced", "empty", "default_dynamic_cp")


def _random_problem(rng: random.Random, num_ranks: int, cp_size: int, **kwargs) -> ScheduleProblem:
    budget = rng.choice([256, 1024, 4096])
    lengths = tuple(rng.randint(1, budget * cp_size) for _ in range(rng.randint(1, 80)))
    return ScheduleProblem(lengths=lengths, dp_size=num_ranks // cp_size, cp_size=cp_size,
                           max_seqlen_per_rank=budget, **kwargs)


@pytest.mark.parametrize("name", SCHEDULERS)
@pytest.mark.parametrize("num_ranks, cp_size", [(1, 1), (2, 2), (6, 2), (6, 3), (8, 4), (12, 2)])
def test_random_inputs_give_valid_schedules(name, num_ranks, cp_size):
    rng = random.Random(num_ranks * 100 + cp_size)
    for _ in range(30):
        problem = _random_problem(rng, num_ranks, cp_size)
        schedule = get_scheduler(name)(problem)
        validate_schedule(problem, schedule)


def test_eight_sequences_vpp_group_four_on_eight_ranks():
    """Upstream asserts here (RESEARCH B.2); we reach 4 micro-batches with every rank busy."""
    rng = random.Random(0)
    for _ in range(200):
        lengths = tuple(rng.randint(100, 4000) for _ in range(8))
        problem = ScheduleProblem(lengths=lengths, dp_size=4, cp_size=2, max_seqlen_per_rank=4096,
                                  vpp_group_size=4, min_num_microbatches=4,
                                  cost=CostModel(a=1.0, b=0.0, g=0.0, d=0.0))
        schedule = get_scheduler("default_dynamic_cp")(problem)
        validate_schedule(problem, schedule, problem.layout)
        assert schedule.num_microbatches() == 4
        assert idle_rank_slots(schedule) == 0


def test_fewer_sequences_than_vpp_multiple_pads_with_empty_microbatches():
    problem = ScheduleProblem(lengths=(50, 60, 70), dp_size=2, cp_size=2, max_seqlen_per_rank=512,
                              vpp_group_size=4, min_num_microbatches=2)
    for name in SCHEDULERS:
        schedule = get_scheduler(name)(problem)
        validate_schedule(problem, schedule)
        assert schedule.num_microbatches() == 4
        assert sum(1 for ranks in schedule.microbatches if any(ranks)) == 3


def test_reaches_pipeline_depth_when_data_allows():
    lengths = tuple([100] * 32)
    problem = ScheduleProblem(lengths=lengths, dp_size=4, cp_size=2, max_seqlen_per_rank=4096,
                              min_num_microbatches=8)
    for name in SCHEDULERS:
        schedule = get_scheduler(name)(problem)
        validate_schedule(problem, schedule)
        assert schedule.num_microbatches() >= 8, name


@pytest.mark.parametrize("num_ranks", [6, 12, 10])
def test_non_power_of_two_uses_only_existing_groups(num_ranks):
    rng = random.Random(num_ranks)
    for _ in range(50):
        lengths = tuple(rng.randint(1, 512 * num_ranks) for _ in range(rng.randint(1, 40)))
        problem = ScheduleProblem(lengths=lengths, dp_size=num_ranks, cp_size=1,
                                  max_seqlen_per_rank=512)
        schedule = get_scheduler("default_dynamic_cp")(problem)
        validate_schedule(problem, schedule, problem.layout)
        assert set(schedule.cp_sizes) <= set(problem.layout.sizes)


def test_longest_sequence_may_use_all_ranks_on_non_power_of_two():
    """Upstream fails when L needs more than (largest power of two <= N) x budget."""
    problem = ScheduleProblem(lengths=(5900, 10), dp_size=6, cp_size=1, max_seqlen_per_rank=1000)
    schedule = get_scheduler("default_dynamic_cp")(problem)
    validate_schedule(problem, schedule, problem.layout)
    assert schedule.cp_sizes[0] == 6


def test_dynamic_cp_never_worse_than_dp_balanced():
    rng = random.Random(7)
    for _ in range(150):
        cp_size = rng.choice([1, 2, 4])
        problem = _random_problem(rng, cp_size * rng.randint(1, 4), cp_size,
                                  cost=rng.choice([CostModel(), CostModel(a=1, b=0, g=0, d=0)]))
        dynamic = critical_path(problem, get_scheduler("default_dynamic_cp")(problem))
        static = critical_path(problem, get_scheduler("dp_balanced")(problem))
        assert dynamic <= static * (1 + 1e-9), (problem.lengths, dynamic, static)


def test_realistic_batches_keep_every_rank_busy():
    rng = random.Random(3)
    for _ in range(40):
        lengths = tuple(rng.randint(256, 8192) for _ in range(256))
        problem = ScheduleProblem(lengths=lengths, dp_size=8, cp_size=2, max_seqlen_per_rank=4096,
                                  cost=CostModel(a=1, b=0, g=0, d=0))
        assert idle_rank_slots(get_scheduler("default_dynamic_cp")(problem)) == 0


def test_empty_scheduler_respects_owners():
    problem = ScheduleProblem(lengths=(100, 200, 300, 400, 500), dp_size=2, cp_size=2,
                              max_seqlen_per_rank=300, owners=(0, 1, 1, 0, 1))
    schedule = get_scheduler("empty")(problem)
    validate_schedule(problem, schedule, problem.static_layout)
    for ranks in schedule.microbatches:
        for rank, ids in enumerate(ranks):
            assert all(problem.owners[seq] == rank // 2 for seq in ids)


def test_empty_batch():
    problem = ScheduleProblem(lengths=(), dp_size=2, cp_size=1, max_seqlen_per_rank=10,
                              vpp_group_size=2)
    for name in SCHEDULERS:
        schedule = get_scheduler(name)(problem)
        validate_schedule(problem, schedule)
        assert schedule.num_microbatches() == 2 and not any(any(r) for r in schedule.microbatches)


_CHILD = """
import json, random, sys
sys.path.insert(0, {root!r})
from megatron.varlen.scheduling import ScheduleProblem, get_scheduler
rng = random.Random(11)
out = []
for dp, cp in [(4, 2), (3, 2), (16, 1)]:
    lengths = tuple(rng.randint(1, 4096 * cp) for _ in range(300))
    problem = ScheduleProblem(lengths=lengths, dp_size=dp, cp_size=cp, max_seqlen_per_rank=4096)
    for name in ("dp_balanced", "empty", "default_dynamic_cp"):
        schedule = get_scheduler(name)(problem)
        out.append([schedule.microbatches, schedule.cp_sizes])
print(json.dumps(out))
"""


def test_deterministic_across_processes():
    outputs = set()
    for hash_seed in ("0", "1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        result = subprocess.run([sys.executable, "-c", _CHILD.format(root=REPO_ROOT)], env=env,
                                capture_output=True, text=True, timeout=120, check=True)
        outputs.add(result.stdout)
    assert len(outputs) == 1
    assert json.loads(outputs.pop())
