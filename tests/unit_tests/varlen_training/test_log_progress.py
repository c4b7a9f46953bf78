"""--log-progress (Megatron-LM's progress.txt) and the floating-point operations so far that
checkpoints keep under Megatron-LM's key.

References, none taken from the code under test: the operations are Megatron-LM's
``transformer_flops`` formula (core_v0.16.1, dense GPT) written out below per sequence, summed
over the real lengths the run trained (the mock SFT lengths file, read in order); the lines are
read by a parser written from Megatron-LM's format strings (tests/harness/megatron_lm_progress.py);
the start of the cumulative throughput follows Megatron-LM's ``get_start_time_from_progress_log``
on lines written by hand.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta

import pytest
import torch

from megatron.varlen_training import checkpoint, progress_log
from megatron.varlen_training.arguments import parse_args
from megatron.varlen_training.config.from_flags import run_config
from megatron.varlen_training.progress_log import PROGRESS_FILENAME, job_start_in_log, throughputs
from tests.harness.megatron_lm_progress import (
    SAVED_CHECKPOINT, STARTING_JOB, parse_progress_file,
)
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import TINY_GPT_ARGS, stepping_trainer, train_on_this_rank

LENGTHS = (5, 17, 32, 9, 23, 2, 30, 12, 7, 26, 14, 19)  # real sample lengths, read in order
LAYERS, HIDDEN, HEADS, VOCAB, SEQ = 1, 16, 2, 64, 32
GBS, ITERS, SAVE_INTERVAL = 4, 4, 2
JOB_ID = "4711"
FLOPS_KEY = "num_floating_point_operations_so_far"  # Megatron-LM's checkpoint key


def _argv(lengths_file: str) -> list[str]:
    """A one-layer packed SFT run on mock data whose sample lengths are ``LENGTHS``."""
    config = json.dumps({"mode": "file", "path": lengths_file})
    return [
        "--num-layers", str(LAYERS), "--hidden-size", str(HIDDEN),
        "--num-attention-heads", str(HEADS), "--seq-length", str(SEQ),
        "--micro-batch-size", "1", "--global-batch-size", str(GBS), "--lr", "1e-3",
        "--lr-decay-iters", str(ITERS), "--mock-data", "--sft",
        "--sft-mock-dataset-config-json", config, "--sequence-packing",
        "--tokenizer-type", "NullTokenizer", "--vocab-size", str(VOCAB),
        "--make-vocab-size-divisible-by", "32", "--log-interval", "1", "--eval-iters", "0",
        "--seed", "3", "--train-iters", str(ITERS), "--save-interval", str(SAVE_INTERVAL),
        "--log-progress",
    ]


def _sequence_flops(length: int) -> int:
    """Megatron-LM's training FLOPs of one sequence (its ``transformer_flops`` at batch 1,
    ``seq_length`` = the real length): 3 (forward, two backward GEMMs) x 2 (multiply-add) x
    per token [QKV h*3q, out q*h, MLP 2*h*f, logits h*V], plus causal attention q*L/2*2."""
    h, q, f = HIDDEN, HIDDEN, 4 * HIDDEN  # MHA; --ffn-hidden-size defaults to 4h
    per_token = LAYERS * (h * 3 * q + q * h + 2 * h * f) + h * VOCAB
    return 3 * 2 * (length * per_token + LAYERS * q * length * length)


def _flops_after(iterations: int) -> int:
    """The operations of the first ``iterations`` global batches (samples in order)."""
    return sum(_sequence_flops(LENGTHS[i % len(LENGTHS)]) for i in range(iterations * GBS))


def _saved_flops(root: str, iteration: int) -> int:
    """The checkpoint's value under Megatron-LM's key (megatron-core's common.pt)."""
    path = os.path.join(root, f"iter_{iteration:07d}", "common.pt")
    return torch.load(path, weights_only=True)[FLOPS_KEY]


def _resave_without_flops(argv: list[str], source: str, root: str) -> None:
    """Loads ``source``'s iteration 2 and saves it under ``root`` the way a checkpoint written
    before the operations were recorded is: without Megatron-LM's key."""
    with stepping_trainer(argv + ["--load", source, "--ckpt-step", "2"]) as (trainer, state, _):
        checkpoint.save_checkpoint(root, state.iteration, state.model, state.optimizer,
                                      state.scheduler, trainer.run)


def _straight_then_resumed(argv: list[str], root: str, old: str) -> tuple[dict, int, int]:
    """Rank function: 4 iterations saved at 2 and 4; then a second job resumed from
    iteration 2 into the same folder, saving 4 again; then a job resumed from a checkpoint of
    iteration 2 without the key. The values each checkpoint recorded."""
    os.environ["SLURM_JOB_ID"] = JOB_ID
    train_on_this_rank(argv + ["--save", root])
    first = {iteration: _saved_flops(root, iteration) for iteration in (2, 4)}
    train_on_this_rank(argv + ["--save", root, "--load", root, "--ckpt-step", "2"])
    resumed = _saved_flops(root, 4)
    _resave_without_flops(argv, root, old)  # --log-progress without --save: writes nothing
    assert FLOPS_KEY not in torch.load(os.path.join(old, "iter_0000002", "common.pt"),
                                       weights_only=True)
    train_on_this_rank(argv + ["--save", old, "--load", old])
    return first, resumed, _saved_flops(old, 4)


def test_checkpoints_count_real_flops_and_progress_txt_has_megatron_lm_lines(tmp_path):
    lengths_file = tmp_path / "lengths.csv"
    lengths_file.write_text("".join(f"{n}\n" for n in LENGTHS))
    root, old = str(tmp_path / "ckpt"), str(tmp_path / "old")
    first, resumed, from_old = run_distributed(
        _straight_then_resumed, 1, args=(_argv(str(lengths_file)), root, old), timeout_s=240)[0]
    assert first == {2: _flops_after(2), 4: _flops_after(4)}
    assert resumed == _flops_after(4), "a resume must continue the count, not restart it"
    # Megatron-LM's default for a checkpoint without the key: the count starts at 0
    assert from_old == _flops_after(4) - _flops_after(2)
    old_lines = parse_progress_file((tmp_path / "old" / "progress.txt").read_text())
    assert [line.event for line in old_lines] == [STARTING_JOB, SAVED_CHECKPOINT]
    assert old_lines[1].values["Floating-point operations"] == float(f"{from_old:.2e}")

    lines = parse_progress_file((tmp_path / "ckpt" / "progress.txt").read_text())
    assert [line.event for line in lines] == [STARTING_JOB, SAVED_CHECKPOINT, SAVED_CHECKPOINT,
                                              STARTING_JOB, SAVED_CHECKPOINT]
    assert {(line.job_id, line.num_gpus) for line in lines} == {(JOB_ID, 1)}
    assert [line.stamp for line in lines] == sorted(line.stamp for line in lines)
    saved = [line.values for line in lines if line.event == SAVED_CHECKPOINT]
    assert [values["Iteration"] for values in saved] == [2, 4, 4]
    for values in saved:
        iteration = values["Iteration"]
        assert values["Floating-point operations"] == float(f"{_flops_after(iteration):.2e}")
        # Megatron-LM's tokens: consumed samples x --seq-length
        assert values["Tokens (in billions)"] == round(iteration * GBS * SEQ / 10 ** 9, 2)
        assert values["Job throughput"] >= 0 and values["Cumulative throughput"] >= 0


def _line(stamp: str, gpus: int, event: str, flops: float | None = None) -> str:
    """A progress.txt line as Megatron-LM's format strings write it."""
    tail = "" if flops is None else (f"\tIteration: 1\tJob throughput: 1.0 TFLOP/s/GPU\t"
                                     f"Cumulative throughput: 1.0 TFLOP/s/GPU\t"
                                     f"Floating-point operations: {flops:.2e}\t"
                                     f"Tokens (in billions): 0.01")
    return f"{stamp}\tJob ID: 9\t# GPUs: {gpus}\t{event}{tail}\n"


LOG = [
    _line("2026-01-01 00:00:00", 8, STARTING_JOB),
    _line("2026-01-01 01:00:00", 8, SAVED_CHECKPOINT, 1e18),
    _line("2026-01-01 02:00:00", 16, STARTING_JOB),
    _line("2026-01-01 03:00:00", 16, SAVED_CHECKPOINT, 3e18),
    "\n",  # not a line Megatron-LM writes: skipped, not a crash
    _line("2026-01-01 04:00:00", 8, STARTING_JOB),
    _line("2026-01-01 05:00:00", 8, SAVED_CHECKPOINT, 4e18),
    _line("2026-01-01 06:00:00", 8, STARTING_JOB),
]


@pytest.mark.parametrize("world_size, expected", [
    # the jobs of 8 GPUs since the change back from 16: the 04:00 start, after the 3e18 save
    (8, (datetime(2026, 1, 1, 4), 3e18)),
    (4, None),  # no job of this size
])
def test_cumulative_start_is_the_first_job_since_the_world_size_changed(world_size, expected):
    assert job_start_in_log(LOG, world_size) == expected
    # 16 GPUs: its jobs ended with the change back to 8 (Megatron-LM starts the search again)
    assert job_start_in_log(LOG[:4], 16) == (datetime(2026, 1, 1, 2), 1e18)
    assert job_start_in_log(LOG, 16) is None


def test_throughputs_are_tflops_per_gpu_since_the_job_and_since_the_first_start():
    first_stamp = datetime(2026, 1, 1, 4)
    now = (first_stamp + timedelta(seconds=1000)).timestamp()
    job, cumulative = throughputs(3 * 10 ** 15, (now - 100, 10 ** 15), (first_stamp, 5e14),
                                  now, world_size=2)
    assert job == pytest.approx(2e15 / (100 * 1e12 * 2))  # 10 TFLOP/s per GPU
    assert cumulative == pytest.approx(2.5e15 / (1000 * 1e12 * 2))


@pytest.mark.parametrize("save", [[], ["--save", "/tmp/run"]])
def test_log_progress_is_accepted_with_and_without_save(save):
    """Megatron-LM's flag; without --save it writes nothing there, and nothing here."""
    args = parse_args(TINY_GPT_ARGS + ["--train-iters", "2", "--log-progress"] + save,
                      world_size=1)
    assert run_config(args).logging.log_progress


@pytest.mark.parametrize("rank", [0, 1])
def test_only_global_rank_0_writes_and_names_the_world_size(monkeypatch, tmp_path, rank):
    """Every rank calls the log (one exchange agrees on errors); rank 0 alone appends."""
    monkeypatch.setattr(progress_log, "agree_on_errors", lambda step, *args: step(*args))
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: rank)
    monkeypatch.setenv("SLURM_JOB_ID", JOB_ID)
    log = progress_log.ProgressLog(str(tmp_path / "new"), world_size=16, started_at=0.0,
                                   seq_length=SEQ)
    log.job_started()
    log.checkpoint_saved(3, flops_so_far=5 * 10 ** 18, flops_at_start=10 ** 18,
                         consumed_samples=10 ** 6)
    if rank != 0:
        assert not (tmp_path / "new").exists()
        return
    lines = parse_progress_file((tmp_path / "new" / PROGRESS_FILENAME).read_text())
    assert [(line.event, line.job_id, line.num_gpus) for line in lines] == [
        (STARTING_JOB, JOB_ID, 16), (SAVED_CHECKPOINT, JOB_ID, 16)]
    assert lines[1].values["Floating-point operations"] == 5e18
    assert lines[1].values["Tokens (in billions)"] == round(10 ** 6 * SEQ / 10 ** 9, 2)
