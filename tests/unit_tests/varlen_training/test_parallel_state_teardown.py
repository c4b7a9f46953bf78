"""A run's teardown destroys the process groups megatron-core made for it: a long-lived process
(several ``MegatronWrap``s in one script, the harness's multi-run launches) keeps no group and no
gloo thread of an earlier run (megatron-core 0.16.1's ``destroy_model_parallel`` alone leaves
them: 17 more groups per rank and run here, each with its gloo threads)."""

import os

import torch.distributed as dist
from megatron.core import parallel_state

from megatron.varlen_training.initialize import teardown_parallel_state
from tests.harness.multirank import run_distributed

RUNS = 3
# Every kind of group megatron-core makes: TP, CP, DP (+ gloo copies), EP and expert DP.
SIZES = {"tensor_model_parallel_size": 1, "context_parallel_size": 2,
         "expert_model_parallel_size": 2}


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))  # the OS's own count: C++ threads included


def _groups_alive() -> int:
    # torch's registry of process groups not yet destroyed (the default group included)
    return len(dist.distributed_c10d._world.pg_map)


def _runs_one_after_another() -> list[tuple[int, int]]:
    after = []
    for _ in range(RUNS):
        parallel_state.initialize_model_parallel(**SIZES)
        assert _groups_alive() > 1
        teardown_parallel_state()
        after.append((_threads(), _groups_alive()))
    return after


def _process_group_ended_first() -> bool:
    """A user error ends the process group before the trainer closes (errors.py): its groups
    went with it, and the teardown must still end the parallel state without an error."""
    parallel_state.initialize_model_parallel(**SIZES)
    dist.destroy_process_group()
    teardown_parallel_state()
    return parallel_state.model_parallel_is_initialized()


def _both_cases() -> tuple[list[tuple[int, int]], bool]:
    return _runs_one_after_another(), _process_group_ended_first()


def test_teardown_leaves_no_group_or_thread_of_the_run():
    for after, still_initialized in run_distributed(_both_cases, world_size=2, timeout_s=120):
        assert [groups for _, groups in after] == [1] * RUNS  # the default group alone
        assert len({threads for threads, _ in after}) == 1, after  # no growth run to run
        assert not still_initialized
