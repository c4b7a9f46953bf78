"""The multi-rank harness: results, errors, deadlines, and no process outliving a run."""

import multiprocessing
import os
import time

import pytest
import torch

from tests.harness.multirank import DistributedTestError, process_alive, run_distributed


def _sum_of_ranks():
    value = torch.tensor([torch.distributed.get_rank() + 1])
    torch.distributed.all_reduce(value)
    return int(value)


def _sleep_forever():
    time.sleep(3600)


def _start_helper_then(behaviour: str, pid_dir: str):
    """Starts a long-lived helper process (as dist_checkpointing does), then ends as told."""
    helper = multiprocessing.get_context("spawn").Process(target=_sleep_forever)
    helper.start()
    with open(os.path.join(pid_dir, f"{torch.distributed.get_rank()}.pid"), "w") as out:
        out.write(str(helper.pid))
    if behaviour == "raise" and torch.distributed.get_rank() == 1:
        raise RuntimeError("rank 1 fails on purpose")
    if behaviour == "hang":
        time.sleep(3600)
    return "ok"


def test_results_come_back_in_rank_order():
    assert run_distributed(_sum_of_ranks, 3, timeout_s=60) == [6, 6, 6]


# A hanging run waits out its whole deadline: a short one first; a longer one only where the
# machine was too slow for both ranks to start their helpers within it (else nothing is proved).
HANG_TIMEOUTS_S = (4, 30)


def _run_expecting_failure(behaviour: str, pid_dir, timeout_s: float) -> None:
    with pytest.raises(DistributedTestError) as err:
        run_distributed(_start_helper_then, 2, args=(behaviour, str(pid_dir)),
                        timeout_s=timeout_s)
    assert ("rank 1 fails on purpose" if behaviour == "raise" else "did not finish") \
        in str(err.value)


@pytest.mark.parametrize("behaviour", ["return", "raise", "hang"])
def test_no_process_outlives_the_run(tmp_path, behaviour):
    if behaviour == "return":
        assert run_distributed(_start_helper_then, 2, args=(behaviour, str(tmp_path)),
                               timeout_s=60) == ["ok", "ok"]
    elif behaviour == "raise":
        _run_expecting_failure(behaviour, tmp_path, timeout_s=20)
    else:
        for timeout_s in HANG_TIMEOUTS_S:
            pid_dir = tmp_path / f"timeout_{timeout_s}"
            pid_dir.mkdir()
            _run_expecting_failure(behaviour, pid_dir, timeout_s)
            if len(list(pid_dir.glob("*.pid"))) == 2:
                break
    pids = [int(p.read_text()) for p in tmp_path.rglob("*.pid")]
    assert pids, "the helpers never started: the test would prove nothing"
    deadline = time.monotonic() + 5
    while any(process_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(process_alive(pid) for pid in pids), f"orphaned helper processes {pids}"


def _return_a_tensor():
    return torch.full((1000,), float(torch.distributed.get_rank()))


def test_tensors_survive_the_rank_exiting():
    first, second = run_distributed(_return_a_tensor, 2, timeout_s=60)
    assert torch.equal(first, torch.zeros(1000)) and torch.equal(second, torch.ones(1000))


def _start_method_of_own_children() -> str:
    import multiprocessing as mp

    return mp.get_start_method()


def test_cpu_ranks_fork_their_own_children():
    """DataLoader workers (--num-workers) are forked as under torchrun, not started through a
    fresh forkserver per rank (7 s of a 0.7 s run)."""
    assert run_distributed(_start_method_of_own_children, 2, timeout_s=60) == ["fork", "fork"]
