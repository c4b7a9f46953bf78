"""A run resumed with another --global-batch-size continues at the samples its checkpoint
consumed (Megatron-LM's sampler does), training and validation, through pretrain_gpt.py's
loop on one gloo rank (one process for all runs).

4 samples per step for 2 iterations (saved, --exit-interval), resumed with 8 for 2 more
(saved), resumed again with 8 to the end of --train-samples 40: every step's batch size,
consumed samples, learning rate and loss equal a plain unpacked reference stepped by hand on
the same samples in the same order (batches [0, 4), [4, 8), [8, 16), ..., the dataset cut to
each step's samples), which knows nothing of anchors; the packed path resumed from the same
checkpoint equals it too, on one rank and with dynamic context parallelism on two; the second resume continues at its checkpoint's 24 samples, not at
4 x 8. Every second iteration evaluates one validation batch of the run's size: the resumed
runs read on from the 4 validation samples the first run read ([4, 12), then [12, 20), and
[20, 28) at the end), which 8 does not divide. The schedule arithmetic and the flag layer's
anchor are in test_batch_size_anchor.py.
"""

import contextlib
import io
import json

import pytest

from megatron.varlen_training import training
from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.trainer import Trainer
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import (
    assert_steps_close, one_batch_of, step_records, train_on_this_rank,
)

SEQ, TRAIN_SAMPLES, SMALL, LARGE = 64, 40, 4, 8
RTOL = 1e-5  # float32 rounding (packed and unpacked sum the same terms in other orders)
# (first sample, size) of every step: 2 steps of 4, then steps of 8 to --train-samples 40.
BATCHES = [(0, 4), (4, 4), (8, 8), (16, 8), (24, 8), (32, 8)]
# The validation samples read after iterations 2, 4 and 6, and at the end of training.
VALIDATIONS = {2: (0, 4), 4: (4, 12), 6: (12, 20), "end": (20, 28)}
LENGTHS = json.dumps({"mode": "distribution", "type": "lognormal", "min_seq_len": 1,
                      "max_seq_len": SEQ, "mean_seq_len": 20, "lognormal_sigma": 1.0})
BASE = [
    "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
    "--seq-length", str(SEQ), "--micro-batch-size", "1",
    "--lr", "2e-3", "--lr-warmup-samples", "10", "--lr-decay-style", "cosine",
    "--train-samples", str(TRAIN_SAMPLES),
    "--mock-data", "--sft", "--sft-mock-dataset-config-json", LENGTHS,
    "--tokenizer-type", "NullTokenizer", "--vocab-size", "128",
    "--make-vocab-size-divisible-by", "32", "--hidden-dropout", "0", "--attention-dropout", "0",
    "--position-embedding-type", "rope", "--log-interval", "1", "--eval-iters", "1",
    "--eval-interval", "2",
    "--seed", "11", "--calculate-per-token-loss",
]


def _gbs(size: int) -> list[str]:
    return ["--global-batch-size", str(size)]


def _reference() -> tuple[list[dict], dict]:
    """Step k trains BATCHES[k] as one fixed-size global batch of the unpacked provider; the
    validation losses of VALIDATIONS, each one batch of the samples named."""
    from megatron.varlen_training.pretrain import build_data_providers

    records, validations = [], {}
    # --eval-iters 2 only sizes the validation split past the 28 samples read (evaluate below
    # reads one batch at a time); the training flags are the first run's.
    argv = BASE + _gbs(SMALL) + ["--eval-iters", "2"]
    trainer = Trainer(parse_run_config(argv, world_size=1), console=False)
    try:
        trainer.start()
        providers = build_data_providers(trainer)
        state = trainer.setup_model_and_optimizer()
        evaluate = lambda when: training.evaluate(  # noqa: E731
            trainer.run, state, one_batch_of(providers.valid, *VALIDATIONS[when], SEQ), 0,
            num_batches=1)
        for iteration, (first, size) in enumerate(BATCHES, start=1):
            batch = one_batch_of(providers.train, first, first + size, SEQ).step_batches(0)
            report = trainer.step(batch, num_samples=size)
            records.append({"iteration": iteration, "global_batch_size": size,
                            "consumed_samples": first + size,
                            "lr": report.metrics.learning_rate, "lm_loss": report.loss})
            if iteration in VALIDATIONS:
                validations[iteration] = evaluate(iteration)
        validations["end"] = evaluate("end")
    finally:
        trainer.close()
    return records, validations


def _all_runs(root: str) -> dict:
    """Every run on this rank; a run that fails gives its error (text), so the others are
    still compared; ``notes``: each run's console lines about where its data resumes;
    ``validations``: each run's validation losses by iteration ("end": the end of training)."""
    def run(name: str, *extra: str) -> list[dict] | str:
        path = f"{root}/{name}.jsonl"
        console = io.StringIO()
        try:
            with contextlib.redirect_stdout(console):
                history = train_on_this_rank(BASE + list(extra) + ["--log-metrics-jsonl",
                                                                   path])["history"]
        except Exception as err:  # noqa: BLE001 -- reported by the test that reads the run
            return f"{type(err).__name__}: {err}"
        finally:
            notes[name] = [line.split(" INFO ", 1)[-1].strip() for line in
                           console.getvalue().splitlines() if "resuming the training" in line]
        records = step_records(path)
        validations[name] = {
            **{r["iteration"]: h["validation_loss"] for r, h in zip(records, history)
               if h["validation_loss"] is not None},
            **({"end": history[-1]["end_validation_loss"]}
               if "end_validation_loss" in history[-1] else {})}
        return records

    ckpt, notes, validations = f"{root}/ckpt", {}, {}
    saving = ["--save", ckpt]
    reference, reference_validations = _reference()
    return {"reference": reference, "notes": notes, "validations": validations,
            "reference_validations": reference_validations, "checkpoints": ckpt,
            "small": run("small", *_gbs(SMALL), *saving, "--exit-interval", "2"),
            "packed": run("packed", *_gbs(LARGE), "--sequence-packing", "--load", ckpt),
            "large": run("large", *_gbs(LARGE), *saving, "--load", ckpt, "--exit-interval", "4"),
            "again": run("again", *_gbs(LARGE), "--load", ckpt)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("batch_size_resume"))
    (result,) = run_distributed(_all_runs, 1, args=(root,), timeout_s=300)
    return result


def test_the_reference_moves():
    assert [size for _, size in BATCHES] == [4, 4, 8, 8, 8, 8]
    assert sum(size for _, size in BATCHES) == TRAIN_SAMPLES


def test_a_larger_batch_continues_at_the_checkpoints_samples(runs):
    assert len({r["lm_loss"] for r in runs["reference"]}) > 1  # the losses move
    assert_steps_close(runs["small"], runs["reference"][:2], RTOL)
    assert_steps_close(runs["large"], runs["reference"][2:4], RTOL)


def test_the_packed_path_resumes_the_same_way(runs):
    assert_steps_close(runs["packed"], runs["reference"][2:], RTOL)


def test_a_second_resume_continues_at_its_checkpoints_samples(runs):
    """Resumed at iteration 4 with the same size: batch 4 starts at sample 24 (8 samples by
    iteration 2, then 2 x 8), not at 4 x 8 = 32."""
    assert_steps_close(runs["again"], runs["reference"][4:], RTOL)


# Two ranks of dynamic context parallelism, resumed from the one-rank checkpoint of iteration 2:
# a sample of up to 32 tokens trains on one rank, a longer one is split over both (CP 2).
DYNAMIC_CP = ["--sequence-packing", "--dynamic-context-parallel", "--context-parallel-size", "2",
              "--max-seqlen-per-dp-cp-rank", str(SEQ // 2)]


def _dynamic_cp_resumed(checkpoints: str, path: str) -> None:
    train_on_this_rank(BASE + _gbs(LARGE) + DYNAMIC_CP + [
        "--load", checkpoints, "--ckpt-step", "2", "--log-metrics-jsonl", path])


def test_dynamic_cp_on_two_ranks_resumes_the_same_way(runs, tmp_path):
    path = tmp_path / "dynamic_cp.jsonl"
    run_distributed(_dynamic_cp_resumed, 2, args=(runs["checkpoints"], str(path)),
                    timeout_s=300)
    assert_steps_close(step_records(path), runs["reference"][2:], RTOL)


def test_the_console_says_where_the_data_resumes(runs):
    assert runs["notes"]["large"] == [
        "> resuming the training data at sample 8, the checkpoint's consumed samples, with "
        "--global-batch-size 8 (the checkpoint's run trained 4)"]
    assert runs["notes"]["again"] == [
        "> resuming the training data at sample 24, the checkpoint's consumed samples (its run "
        "trained batches of other sizes before)"]


def test_validation_reads_on_from_the_checkpoints_validation_samples(runs):
    """The first run's evaluation read validation samples [0, 4); the resumed runs, evaluating
    batches of 8, read [4, 12), [12, 20), [20, 28) (not [0, 8) again: 4 // 8 batches read)."""
    want, got = runs["reference_validations"], runs["validations"]
    assert len(set(want.values())) == len(want)  # each window its own loss
    for name, whens in [("small", [2]), ("large", [4]), ("packed", [4, 6, "end"]),
                        ("again", [6, "end"])]:
        assert list(got[name]) == whens, name
        assert [got[name][w] for w in whens] == pytest.approx([want[w] for w in whens],
                                                              rel=RTOL), name
