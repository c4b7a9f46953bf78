"""Train 6 iterations, vs 3 + save + load + 3 more: identical losses (dist_checkpointing)."""

import os

import pytest

from megatron.varlen_training.checkpoint import TRACKER_FILENAME, checkpoint_dir
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import TINY_GPT_ARGS, loss_owner_history, train_on_this_rank

# The LR schedule must not depend on where the run stops: fix the decay horizon.
BASE = TINY_GPT_ARGS + ["--lr-decay-iters", "6", "--lr-warmup-iters", "1"]
WORLD = 2


def _history(extra):
    return loss_owner_history(
        run_distributed(train_on_this_rank, WORLD, args=(BASE + extra,), timeout_s=240))


@pytest.mark.parametrize("optimizer", [[], ["--use-distributed-optimizer"]],
                         ids=["adam", "distributed_optimizer"])
def test_resume_continues_identically(tmp_path, optimizer):
    straight = _history(["--train-iters", "6"] + optimizer)
    first = _history(["--train-iters", "3", "--save", str(tmp_path)] + optimizer)
    assert (tmp_path / TRACKER_FILENAME).read_text() == "3"
    assert os.path.isdir(checkpoint_dir(str(tmp_path), 3))
    resumed = _history(["--train-iters", "6", "--load", str(tmp_path)] + optimizer)
    assert len(resumed) == 3, "resume must continue from iteration 3, not restart"
    got = [h["lm_loss"] for h in first + resumed]
    want = [h["lm_loss"] for h in straight]
    assert got == want, f"resumed {got} != straight {want}"
