"""--rampup-batch-size through pretrain_gpt.py's loop, on one gloo rank (one process for all
runs): each step's ``global batch size``, consumed samples and learning rate, and its loss,
equal a plain unpacked reference that trains the same samples in the same order with
megatron-core's calculator's batch sizes, one fixed-size global batch per step (the dataset
cut to the step's samples, no ramp-up); the packed run equals it too, on one rank and with
dynamic context parallelism on two ranks (one small gloo run); a run resumed in the middle of
the ramp-up equals the uninterrupted one; a checkpoint is saved whenever the batch grows; the
console says how the batch ramps up.

Mock SFT samples of varied lengths, so packing makes other micro-batches than the unpacked
path (every run counts the loss per token, as packing does). Ramp-up 2 2 8 to
--global-batch-size 6 over 26 samples: batches of 2, 2, 4, then 6 (megatron-core's calculator
decides them in the reference).
"""

import contextlib
import io
import json
import os

import pytest
from megatron.core.num_microbatches_calculator import RampupBatchsizeNumMicroBatchesCalculator

from tests.harness.multirank import run_distributed
from tests.harness.training_runs import (
    assert_steps_close, one_batch_of, step_records, stepping_trainer, train_on_this_rank,
)

GBS, SEQ, TRAIN_SAMPLES, RAMP = 6, 64, 26, (2, 2, 8)
RTOL = 1e-5  # float32 rounding (packed and unpacked sum the same terms in other orders)
RESUME_AT = 3  # mid-ramp: the batch grows from 4 to 6 after iteration 3
LENGTHS = json.dumps({"mode": "distribution", "type": "lognormal", "min_seq_len": 1,
                      "max_seq_len": SEQ, "mean_seq_len": 20, "lognormal_sigma": 1.0})
BASE = [
    "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
    "--seq-length", str(SEQ), "--micro-batch-size", "1", "--global-batch-size", str(GBS),
    "--lr", "2e-3", "--lr-warmup-samples", "10", "--train-samples", str(TRAIN_SAMPLES),
    "--mock-data", "--sft", "--sft-mock-dataset-config-json", LENGTHS,
    "--tokenizer-type", "NullTokenizer", "--vocab-size", "128",
    "--make-vocab-size-divisible-by", "32", "--hidden-dropout", "0", "--attention-dropout", "0",
    "--position-embedding-type", "rope", "--log-interval", "1", "--eval-iters", "0",
    "--seed", "11", "--calculate-per-token-loss",
]
RAMPUP = ["--rampup-batch-size", *map(str, RAMP)]


def _core_batches() -> list[tuple[int, int]]:
    """(first sample, size) of every step: megatron-core's calculator updated with the samples
    consumed before it, for as many steps as Megatron-LM's loop runs (consumed samples within
    the ramp-up and --train-samples, then whole global batches of what is left)."""
    calculator = RampupBatchsizeNumMicroBatchesCalculator(GBS, 1, 1, False, 0, *RAMP)
    batches, consumed = [], 0
    while consumed <= RAMP[2] or consumed + GBS <= TRAIN_SAMPLES:
        calculator.update(consumed, consistency_check=True)
        size = calculator.get_current_running_global_batch_size()
        batches.append((consumed, size))
        consumed += size
    return batches


def _reference() -> list[dict]:
    """A run without ramp-up stepped by hand: step k trains its samples as one fixed-size
    global batch of the unpacked provider (the dataset cut to those samples)."""
    records = []
    with stepping_trainer(BASE) as (trainer, _, provider):
        for iteration, (first, size) in enumerate(_core_batches(), start=1):
            step = one_batch_of(provider, first, first + size, SEQ).step_batches(0)
            report = trainer.step(step, num_samples=size)
            metrics = report.metrics
            records.append({"iteration": iteration, "global_batch_size": size,
                            "consumed_samples": first + size, "lr": metrics.learning_rate,
                            "lm_loss": report.loss})
    return records


def _all_runs(root: str) -> dict:
    """Every run of the module on this rank (one process start for all of them); a run that
    fails gives its error (text), so the other runs are still compared."""
    def run(name: str, *extra: str) -> list[dict] | str:
        path = f"{root}/{name}.jsonl"
        console = io.StringIO()
        try:
            with contextlib.redirect_stdout(console):
                train_on_this_rank(BASE + RAMPUP + list(extra) + ["--log-metrics-jsonl", path])
        except Exception as err:  # noqa: BLE001 -- reported by the test that reads the run
            return f"{type(err).__name__}: {err}"
        lines[name] = [line.split(" INFO ", 1)[1].strip() for line in
                       console.getvalue().splitlines() if "batch size" in line
                       and "iteration" not in line]
        return step_records(path)

    ckpt, lines = f"{root}/ckpt", {}
    runs = {"lines": lines, "reference": _reference(),
            "unpacked": run("unpacked", "--save", ckpt, "--save-interval", str(RESUME_AT))}
    runs["saved"] = sorted(os.listdir(ckpt))
    runs.update(packed=run("packed", "--sequence-packing"),
                resumed=run("resumed", "--load", ckpt, "--ckpt-step", str(RESUME_AT)))
    return runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("rampup"))
    (result,) = run_distributed(_all_runs, 1, args=(root,), timeout_s=300)
    return result


def test_reference_ramps_up():
    sizes = [size for _, size in _core_batches()]
    assert sizes == [2, 2, 4, 6, 6, 6]  # 26 samples


def test_rampup_run_equals_the_fixed_batch_reference(runs):
    assert len({r["lm_loss"] for r in runs["reference"]}) > 1  # the losses move
    assert_steps_close(runs["unpacked"], runs["reference"], RTOL)


def test_packed_rampup_run_equals_the_reference(runs):
    assert_steps_close(runs["packed"], runs["reference"], RTOL)


def test_resumed_mid_ramp_equals_the_uninterrupted_run(runs):
    """Loaded at iteration 3 (the unpacked run's checkpoint, 8 samples consumed)."""
    assert not isinstance(runs["resumed"], str), runs["resumed"]
    assert runs["resumed"][0]["iteration"] == RESUME_AT + 1
    assert runs["resumed"] == runs["unpacked"][RESUME_AT:]  # bit for bit, same layout


def test_a_checkpoint_is_saved_when_the_batch_grows(runs):
    """Megatron-LM saves before the first step of a larger batch: at iterations 2 (2 -> 4) and
    3 (4 -> 6, also --save-interval 3's), then 6 (--save-interval)."""
    assert runs["saved"] == ["iter_0000002", "iter_0000003", "iter_0000006",
                             "latest_checkpointed_iteration.txt"]


# Two ranks of dynamic context parallelism: a sample of up to 32 tokens trains on one rank, a
# longer one is split over both (CP 2).
DYNAMIC_CP = ["--sequence-packing", "--dynamic-context-parallel", "--context-parallel-size", "2",
              "--max-seqlen-per-dp-cp-rank", str(SEQ // 2)]


def _dynamic_cp_on_two_ranks(path: str) -> None:
    train_on_this_rank(BASE + RAMPUP + DYNAMIC_CP + ["--log-metrics-jsonl", path])


def test_dynamic_cp_rampup_on_two_ranks_equals_the_reference(runs, tmp_path):
    """Each step's batch, small or not, is balanced over the DP x CP ranks of that step."""
    path = tmp_path / "dynamic_cp.jsonl"
    run_distributed(_dynamic_cp_on_two_ranks, 2, args=(str(path),), timeout_s=300)
    assert_steps_close(step_records(path), runs["reference"], RTOL)


PLAN = ("will use batch size rampup starting from global batch size 2 to global batch size 6 "
        "with batchsize increments 2 over 8 samples.")


def test_the_console_says_how_the_batch_ramps_up(runs):
    """Megatron-LM's lines (megatron-core's calculator's, verbose): the plan and the initial
    size at start, one line per change; a resumed run jumps to its size at the checkpoint."""
    assert runs["lines"]["unpacked"] == [
        PLAN, "setting initial batch size to 2", "ramping up batch size from 2 to 4",
        "ramping up batch size from 4 to 6"]
    assert runs["lines"]["resumed"] == [
        PLAN, "setting initial batch size to 2", "ramping up batch size from 2 to 6"]
