"""A NaN loss stops the run (every rank, same iteration) before it is
saved; the last good checkpoint stays the latest. The guard decides
BEFORE the optimizer applies the step, so a NaN step changes no weight, optimizer state, LR
schedule or iteration counter."""

import pytest
import torch

from megatron.varlen_training import training
from megatron.varlen_training.checkpoint import TRACKER_FILENAME
from megatron.varlen_training.errors import NonFiniteLossError
from megatron.varlen_training.nonfinite import check_finite
from megatron.varlen_training.optimizer_kernels import torch_adam_optimizers
from tests.harness.multirank import DistributedTestError, run_distributed
from tests.harness.training_runs import TINY_GPT_ARGS, train_on_this_rank

DIVERGING = TINY_GPT_ARGS + ["--lr", "1e4", "--clip-grad", "0", "--train-iters", "6",
                             "--save-interval", "2"]


def test_nan_run_stops_before_saving(tmp_path):
    with pytest.raises(DistributedTestError) as err:
        run_distributed(train_on_this_rank, 2, args=(DIVERGING + ["--save", str(tmp_path)],),
                        timeout_s=240)
    report = str(err.value)
    assert report.startswith("2 of 2 ranks failed"), report  # both ranks, none left waiting
    assert report.count("NonFiniteLossError: iteration 4: lm loss and grad norm are NaN/Inf") \
        == 2, report
    assert (tmp_path / TRACKER_FILENAME).read_text() == "2"
    assert not (tmp_path / "iter_0000004").exists()


def test_opt_out_trains_on(tmp_path):
    run_distributed(train_on_this_rank, 1,
                    args=(DIVERGING + ["--no-check-for-nan-in-loss-and-grad", "--save",
                                       str(tmp_path)],), timeout_s=240)
    assert (tmp_path / TRACKER_FILENAME).read_text() == "6"


def _nan_on_rank_1_only():
    rank = torch.distributed.get_rank()
    try:
        check_finite(7, float("nan") if rank == 1 else 1.0, 0.5)
    except NonFiniteLossError as err:
        return str(err)
    return None


def test_rank_local_nan_stops_every_rank():
    messages = run_distributed(_nan_on_rank_1_only, 2, timeout_s=60)
    assert all(m is not None and m.startswith("iteration 7: lm loss is NaN/Inf")
               for m in messages), messages


def _one_process_decides_without_a_collective():
    def no_collective(*args, **kwargs):
        raise AssertionError("one process has nothing to agree on: no all-reduce")
    torch.distributed.all_reduce = no_collective  # this rank's process only
    check_finite(3, 1.0, 0.5)
    try:
        check_finite(4, 1.0, float("inf"))
    except NonFiniteLossError as err:
        return str(err)
    return None


def test_one_process_decides_on_host_values():
    # On a GPU the device round trip is two host waits per step (tests/gpu/test_gpu_benchmark.py
    # counts them); with one process the decision needs none.
    [message] = run_distributed(_one_process_decides_without_a_collective, 1, timeout_s=60)
    assert message is not None and message.startswith("iteration 4: grad norm is NaN/Inf"), message


def snapshot_training_state(state) -> dict:
    """Copies of everything an optimizer step changes: the model's weights, the optimizer's
    main params and Adam state (both moments and the step counters), the LR schedule's state
    and the iteration counter."""
    inner = list(torch_adam_optimizers(state.optimizer))
    return {
        "weights": [p.detach().clone() for chunk in state.model for p in chunk.parameters()],
        "main params": [p.detach().clone() for opt in inner for group in opt.param_groups
                        for p in group["params"]],
        "adam state": [(key, torch.as_tensor(value).clone()) for opt in inner
                       for entry in opt.state.values() for key, value in sorted(entry.items())],
        "lr schedule": state.scheduler.state_dict(),
        "iteration": state.iteration,
    }


def changed_parts(before: dict, after: dict) -> list[str]:
    """The parts of two snapshots that differ (a NaN never equals anything: it counts)."""
    def same(a, b):
        if isinstance(a, torch.Tensor):
            return a.shape == b.shape and torch.equal(a, b)
        if isinstance(a, (list, tuple)):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        return a == b
    return [part for part in before if not same(before[part], after[part])]


def _watch_the_nan_step(argv) -> dict:
    """The real loop (pretrain -> training.train) with every train_step call watched: a
    snapshot before each, and one after the step that raised."""
    snapshots, seen = [], {}
    real_step = training.train_step

    def watched(args, state, step, **kwargs):
        seen["state"] = state
        snapshots.append(snapshot_training_state(state))
        return real_step(args, state, step, **kwargs)

    training.train_step = watched
    try:
        train_on_this_rank(argv)
    except NonFiniteLossError as err:
        after = snapshot_training_state(seen["state"])
        return {"message": str(err), "steps": len(snapshots),
                "good step changed": changed_parts(snapshots[-2], snapshots[-1]),
                "nan step changed": changed_parts(snapshots[-1], after)}
    finally:
        training.train_step = real_step
    return {"message": None}


@pytest.mark.parametrize("optimizer", ["adam", "distributed"])
def test_nan_step_changes_no_state(optimizer):
    argv = DIVERGING + (["--use-distributed-optimizer"] if optimizer == "distributed" else [])
    for rank in run_distributed(_watch_the_nan_step, 2, args=(argv,), timeout_s=240):
        assert rank["message"] is not None, "the run did not go NaN"
        assert rank["message"].startswith(f"iteration {rank['steps']}: "), rank["message"]
        # The comparison sees a step: every part changes in a good one ...
        assert rank["good step changed"] == ["weights", "main params", "adam state",
                                             "lr schedule", "iteration"], rank
        # ... and none in the NaN one.
        assert rank["nan step changed"] == [], rank
