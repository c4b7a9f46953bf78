"""Issue 10, observation 1: a NaN loss stops the run (every rank, same iteration) before it is
saved; the last good checkpoint stays the latest."""

import pytest
import torch

from megatron.training.checkpointing import TRACKER_FILENAME
from megatron.training.errors import NonFiniteLossError
from megatron.training.nonfinite import check_finite
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
