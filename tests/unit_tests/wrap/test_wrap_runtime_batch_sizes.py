"""Runtime batches of varying sizes: the facade's LR schedule and consumed samples follow the
samples actually trained (Megatron-LM's per-step increment: the samples of the step), also
across save and resume.

The reference is a hand computation of megatron-core's linear warm-up / linear decay schedule
(``OptimizerParamScheduler.get_lr``'s formulas, written out here in float64) at the running
sum of the batch sizes; the LR a step reports is the one the schedule gives after its samples
(Megatron-LM logs it after ``opt_param_scheduler.step``).
"""

import dataclasses
import json
import os

import pytest

from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.errors import CheckpointError
from megatron.varlen_training.resume.consistency import data_position_note
from megatron.varlen_training.resume.run_args_keys import DATA_POSITION_KEY, RUN_ARGS_FILENAME
from megatron.varlen_training.resume.run_args_record import consumed_samples, save_run_args
from megatron.wrap import MegatronWrap
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import TINY_GPT_ARGS

SIZES = [3, 5, 2, 7, 1, 4]  # samples per train() call; global_batch_size is 4
SAVED_AFTER = 3  # steps before the save of the resumed run
LR, MIN_LR, WARMUP, DECAY = 1e-3, 1e-4, 6, 20  # warm-up and decay lengths in samples
CONFIG = {
    "model": {"num_layers": 1, "hidden_size": 16, "num_attention_heads": 2, "seq_length": 32,
              "vocab_size": 64, "make_vocab_size_divisible_by": 32, "hidden_dropout": 0.0,
              "attention_dropout": 0.0},
    "training": {"micro_batch_size": 1, "global_batch_size": 4, "train_samples": 24,
                 "lr": LR, "min_lr": MIN_LR, "lr_warmup_samples": WARMUP,
                 "lr_decay_samples": DECAY, "lr_decay_style": "linear", "seed": 3,
                 "eval_iters": 0},
    "data": {"tokenizer_type": "NullTokenizer"},
    "logging": {"metric_writers": [], "progress_bar": False},
}


def _batch(step: int, size: int) -> list[dict]:
    return [{"input_ids": [(7 * step + 3 * i + j) % 60 + 1 for j in range(5 + (i + step) % 9)]}
            for i in range(size)]


def _train(wrap, steps) -> list[dict]:
    return [wrap.train(_batch(step, SIZES[step])) for step in steps]


def rank_runtime_batches(save_dir: str) -> dict:
    config = {**CONFIG, "checkpoint": {"save": save_dir}}
    with MegatronWrap(config) as wrap:
        straight = _train(wrap.initialize().setup_model_and_optimizer(), range(len(SIZES)))
    with MegatronWrap(config) as wrap:
        _train(wrap.initialize().setup_model_and_optimizer(), range(SAVED_AFTER))
        path = wrap.save()
    with MegatronWrap(config) as wrap:
        loaded = wrap.initialize().setup_model_and_optimizer().load(path)
        resumed = _train(wrap, range(loaded, len(SIZES)))
    return {"straight": straight, "resumed": resumed, "path": path}


def expected_lr(samples: int) -> float:
    """megatron-core's linear warm-up from 0, then linear decay to MIN_LR, at ``samples``."""
    if samples <= WARMUP:
        return LR * samples / WARMUP
    if samples > DECAY:
        return MIN_LR
    return MIN_LR + (1.0 - (samples - WARMUP) / (DECAY - WARMUP)) * (LR - MIN_LR)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("runtime_batches")
    return run_distributed(rank_runtime_batches, 1, args=(str(save_dir),), timeout_s=240)[0]


def _consumed() -> list[int]:
    return [sum(SIZES[:k + 1]) for k in range(len(SIZES))]


def test_consumed_samples_are_the_samples_trained(runs):
    assert [m["consumed_samples"] for m in runs["straight"]] == _consumed()
    assert [m["samples"] for m in runs["straight"]] == SIZES


def test_lr_follows_the_samples_trained(runs):
    lrs = [m["lr"] for m in runs["straight"]]
    assert lrs == pytest.approx([expected_lr(c) for c in _consumed()], rel=1e-9, abs=1e-15)


def test_checkpoint_records_the_samples_trained(runs):
    with open(os.path.join(runs["path"], RUN_ARGS_FILENAME), encoding="utf-8") as handle:
        assert json.load(handle)[DATA_POSITION_KEY] == sum(SIZES[:SAVED_AFTER])


def test_resume_continues_the_count_and_the_schedule(runs):
    straight = runs["straight"][SAVED_AFTER:]
    resumed = runs["resumed"]
    assert [m["consumed_samples"] for m in resumed] == [m["consumed_samples"] for m in straight]
    assert [m["lr"] for m in resumed] == [m["lr"] for m in straight]
    assert [m["loss"] for m in resumed] == pytest.approx([m["loss"] for m in straight],
                                                         rel=1e-6)


# --- who may resume such a checkpoint (no processes: the run_args.json check alone) --------

def _run_config(runtime_batches: bool):
    run = parse_run_config(TINY_GPT_ARGS + ["--train-iters", "8"], world_size=1)
    return dataclasses.replace(
        run, training=dataclasses.replace(run.training, runtime_batches=runtime_batches))


def test_pretrain_gpt_continues_a_facade_checkpoint_at_its_samples(tmp_path):
    """10 samples in 3 steps of a --global-batch-size 4 run: the facade continues after 10,
    and so does pretrain_gpt.py's loop (its batches begin at the checkpoint's consumed samples,
    resumed_batch_anchor.py), not at 3 x 4 = 12; without that anchor (a record the flag layer
    could not read) the position check refuses in one line."""
    folder = os.path.join(str(tmp_path), "iter_0000003")
    os.makedirs(folder)
    save_run_args(folder, _run_config(True), iteration=3, consumed_samples=10)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("3")
    assert consumed_samples(folder, 3, _run_config(True)) == 10
    assert data_position_note(folder, 3, _run_config(True)) == (
        "resuming after 10 consumed training samples (iteration 3)")
    resumed = parse_run_config(TINY_GPT_ARGS + ["--train-iters", "8", "--load", str(tmp_path)],
                               world_size=1)
    assert resumed.training.global_batch_anchor == (3, 10)
    assert data_position_note(folder, 3, resumed) == (
        "resuming the training data at sample 10, the checkpoint's consumed samples (its run "
        "trained batches of other sizes before)")
    with pytest.raises(CheckpointError) as err:
        data_position_note(folder, 3, _run_config(False))
    assert str(err.value).startswith(
        f"--load: {folder} records 10 consumed training samples but iteration 3 x "
        f"--global-batch-size 4 is 12: it was trained on batches of other sizes")
    assert "\n" not in str(err.value)
