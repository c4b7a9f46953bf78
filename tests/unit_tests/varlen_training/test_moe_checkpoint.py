"""MoE checkpoints (megatron-core's dist_checkpointing of the experts): 2 + save + load + 2
iterations == 4 iterations, with expert parallelism 2, and resumed on EP1 from an EP2 save
(the experts are resharded by megatron-core; lm loss and balancing losses within 1e-5)."""

import pytest

from tests.harness.multirank import run_distributed
from tests.harness.training_runs import loss_owner_history, train_on_this_rank
from tests.unit_tests.varlen_training.test_moe_equivalence import GPT, PACKED

RTOL = 1e-5
METRICS = ("lm_loss", "seq_load_balancing_loss", "z_loss", "grad_norm")
EP2 = ["--expert-model-parallel-size", "2"]


def _run(argv, world=2):
    return loss_owner_history(run_distributed(train_on_this_rank, world, args=(argv,),
                                              timeout_s=300))


def _history(argv, world=2):
    return [{key: step[key] for key in METRICS} for step in _run(argv, world)]


def test_resume_equals_straight_run_and_reshards_experts(tmp_path):
    base = GPT + PACKED + ["--train-iters", "4", "--lr-decay-iters", "4"]
    straight = _history(base + EP2)
    save = str(tmp_path / "ckpt")
    first = _history(base + EP2 + ["--exit-interval", "2", "--save", save,
                                   "--save-interval", "2"])
    assert len(first) == 2
    for layout in (EP2,):
        resumed = _history(base + layout + ["--load", save])
        assert len(resumed) == 2
        for step, (got, ref) in enumerate(zip(resumed, straight[2:]), start=3):
            for key in METRICS:
                assert got[key] == pytest.approx(ref[key], rel=RTOL), (layout, step, key)


def test_expert_parallel_layout_change_is_one_line(tmp_path):
    """EP 2 -> 1 changes megatron-core's optimizer layout (a separate expert optimizer):
    refused in one line before megatron-core reads the checkpoint."""
    save = str(tmp_path / "ckpt")
    base = GPT + PACKED + ["--train-iters", "2"]
    _history(base + EP2 + ["--save", save, "--save-interval", "2"])
    with pytest.raises(Exception) as err:
        _history(base + ["--train-iters", "4", "--load", save])
    assert "--expert-model-parallel-size 2, this run has 1" in str(err.value)


def test_dense_checkpoint_is_not_an_moe_model(tmp_path):
    save = str(tmp_path / "dense")
    cut = GPT.index("--num-experts")
    dense = GPT[:cut] + ["--disable-bias-linear"] + GPT[GPT.index("--hidden-size"):]
    _run(dense + PACKED + ["--train-iters", "2", "--save", save, "--save-interval", "2"])
    with pytest.raises(Exception) as err:
        _history(GPT + PACKED + ["--train-iters", "4", "--load", save])
    assert "--num-experts" in str(err.value)
