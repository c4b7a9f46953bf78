"""Hybrid checkpoints (dist_checkpointing, TP=2 so the Mamba mixer's sharded state -- sectioned
in_proj/conv, TP-split gated-norm weight -- is exercised): 4 straight iterations (saving at 2
and 4) == loading the iteration-2 checkpoint and running 2 more, exactly."""

import os

from megatron.varlen_training.checkpoint import TRACKER_FILENAME, checkpoint_dir
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import loss_owner_history, train_hybrid_on_this_rank
from tests.unit_tests.varlen_training.test_hybrid_equivalence import PACKED

# The LR schedule must not depend on where the run stops: fix the decay horizon.
BASE = PACKED + ["--tensor-model-parallel-size", "2", "--lr-decay-iters", "4",
                 "--use-distributed-optimizer"]
WORLD = 2


def _losses(extra):
    history = loss_owner_history(run_distributed(
        train_hybrid_on_this_rank, WORLD, args=(BASE + extra,), timeout_s=240))
    return [h["lm_loss"] for h in history]


def test_hybrid_resume_continues_identically(tmp_path):
    straight = _losses(["--train-iters", "4", "--save", str(tmp_path), "--save-interval", "2"])
    assert os.path.isdir(checkpoint_dir(str(tmp_path), 2))
    (tmp_path / TRACKER_FILENAME).write_text("2")  # resume from the middle checkpoint
    resumed = _losses(["--train-iters", "4", "--load", str(tmp_path)])
    assert len(resumed) == 2, "resume must continue from iteration 2, not restart"
    assert resumed == straight[2:], (resumed, straight)
