"""Sample-based training with packing on: a --train-samples run ends at the same consumed-sample
count, with the same LR sequence and the same losses, as its --train-iters equivalent, while the
packer makes a different number of micro-batches per step; the LR follows the hand-computed
curve of the samples consumed (not of the micro-batches run); a resumed sample-based run
continues the straight run's schedule.

Two DP ranks, packed mock SFT data whose lengths vary, so the packer makes one or more
micro-batches of a step's samples. Per-iteration numbers come from --log-metrics-jsonl.
"""

import json

import pytest

from megatron.varlen_training.errors import CheckpointError
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import TINY_GPT_ARGS, train_on_this_rank

GBS = 8
LR = 2e-3
LENGTHS = json.dumps({"mode": "distribution", "type": "lognormal", "min_seq_len": 1,
                      "max_seq_len": 64, "mean_seq_len": 20, "lognormal_sigma": 1.0})
PACKED = [
    "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
    "--seq-length", "64", "--micro-batch-size", "1", "--global-batch-size", str(GBS),
    "--lr", str(LR), "--mock-data", "--sft", "--sft-mock-dataset-config-json", LENGTHS,
    "--tokenizer-type", "NullTokenizer", "--vocab-size", "128",
    "--make-vocab-size-divisible-by", "32", "--hidden-dropout", "0", "--attention-dropout", "0",
    "--position-embedding-type", "rope", "--log-interval", "1", "--eval-iters", "0",
    "--seed", "11", "--sequence-packing",
]
RUNS = {
    "iterations": ["--train-iters", "5", "--lr-warmup-fraction", "0.25"],
    "samples": ["--train-samples", "40", "--lr-warmup-fraction", "0.25"],
    # 43 samples: 5 whole global batches; the 3 left over are not trained (Megatron-LM).
    "samples_partial_batch": ["--train-samples", "43", "--lr-warmup-samples", "10",
                              "--lr-decay-samples", "40"],
}
# Warm-up over 10 samples (0.25 x 40), linear decay to 0 at 40; the LR after step k is the
# schedule's value at 8k samples.
EXPECTED_LR = [LR * 8 / 10] + [LR * (1 - (8 * k - 10) / 30) for k in range(2, 6)]


def _records(tmp_path, name: str) -> list[dict]:
    path = tmp_path / f"{name}.jsonl"
    run_distributed(train_on_this_rank, 2,
                    args=(PACKED + RUNS[name] + ["--log-metrics-jsonl", str(path)],),
                    timeout_s=300)
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("sample_schedule")
    return {name: _records(tmp_path, name) for name in RUNS}


def test_packing_changes_the_micro_batch_count(records):
    counts = {r["num_microbatches"] for r in records["iterations"]}
    assert len(counts) > 1, counts  # otherwise micro-batches and samples could not be told apart


@pytest.mark.parametrize("name", sorted(set(RUNS) - {"iterations"}))
def test_sample_based_run_equals_its_iteration_equivalent(records, name):
    reference, run = records["iterations"], records[name]
    assert [r["iteration"] for r in run] == [1, 2, 3, 4, 5]
    assert run[-1]["consumed_samples"] == reference[-1]["consumed_samples"] == 5 * GBS
    assert [r["lr"] for r in run] == [r["lr"] for r in reference]
    assert [r["lm_loss"] for r in run] == [r["lm_loss"] for r in reference]
    assert [r["num_microbatches"] for r in run] == [r["num_microbatches"] for r in reference]


def test_lr_follows_the_samples_consumed(records):
    lrs = [r["lr"] for r in records["samples"]]
    assert lrs == pytest.approx(EXPECTED_LR, rel=1e-9, abs=1e-15)


# --- resuming a sample-based run (one rank, unpacked mock data) ------------------------------

RESUMABLE = TINY_GPT_ARGS + ["--train-samples", "32", "--lr-warmup-samples", "6"]  # 8 steps


def _single_rank(argv: list[str]) -> None:
    run_distributed(train_on_this_rank, 1, args=(argv,), timeout_s=240)


def _refusal(argv: list[str]) -> str | None:
    try:
        train_on_this_rank(argv)
    except CheckpointError as err:
        return str(err)
    return None


def test_resumed_sample_based_run_continues_the_schedule(tmp_path):
    """4 + 4 == 8: the scheduler's sample count comes back with the checkpoint, so the resumed
    half has the straight run's learning rates, losses and consumed samples."""
    straight, resumed, root = tmp_path / "straight.jsonl", tmp_path / "resumed.jsonl", tmp_path
    _single_rank(RESUMABLE + ["--log-metrics-jsonl", str(straight)])
    _single_rank(RESUMABLE + ["--save", str(root / "ckpt"), "--exit-interval", "4"])
    _single_rank(RESUMABLE + ["--load", str(root / "ckpt"), "--log-metrics-jsonl", str(resumed)])
    keys = ("iteration", "consumed_samples", "lr", "lm_loss")
    want = [{key: r[key] for key in keys} for r in _read(straight)[4:]]
    assert [{key: r[key] for key in keys} for r in _read(resumed)] == want
    assert want[-1]["consumed_samples"] == 32

    changed = RESUMABLE + ["--lr-decay-samples", "20", "--load", str(root / "ckpt")]
    (message,) = run_distributed(_refusal, 1, args=(changed,), timeout_s=240)
    assert message.startswith("--load: the checkpoint's schedule has --lr-decay-samples "
                              "(default --train-samples) 32, this run has 20;"), message


def _read(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]
