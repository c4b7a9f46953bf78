"""Evaluation in pretrain_gpt.py's loop (megatron/varlen_training/evaluation.py) against
independent references:

- which validation global batches each evaluation reads: a counter that advances as
  Megatron-LM's validation iterator does (one block of --eval-iters batches per evaluation,
  also at the end of training; a checkpoint stores its count, ``consumed_valid_samples``, and a
  resumed run continues from it whatever --eval-interval it resumes with), and the sample
  count the datasets are built for; a resume that would read past them is refused in one line;
  real checkpoints record the count, older ones without it derive it from the iteration,
  and a garbled count is refused in one line;
- the validation and test losses a packed DP2 run (mock SFT samples) and a packed one-rank
  run (Megatron indexed data, megatron-core's test split) report: the per-token mean computed
  directly in this test, sample by sample (one unpacked forward each), over exactly the
  validation and test samples each evaluation must read, with the run's trained model;
- evaluation has no side effect on training: with dropout on, a run that evaluates after every
  iteration trains exactly as one that never evaluates (dense, and MoE with its balancing
  losses); a run stopped by an exit condition skips the end-of-training evaluations;
- the TensorBoard / wandb keys and the log lines are Megatron-LM's, the validation perplexity
  (--log-validation-ppl-to-tensorboard) is exp of the written loss, read back from a real
  event file;
- two cells of tools/probe_combinations.py with ``--eval``: dynamic CP against the single-rank
  unpacked run, and a resumed run against the straight one.
"""

from __future__ import annotations

import json
import math
import os
import sys
from types import SimpleNamespace

import pytest
import torch

from megatron.varlen_training import checkpoint, evaluation, metric_writers, training
from megatron.varlen_training.checkpoint import load as checkpoint_load
from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.config.runtime import RuntimeConfig
from megatron.varlen_training.datasets.builder import build_split_datasets
from megatron.varlen_training.errors import CheckpointError
from megatron.varlen_training.loop_steps import eval_mode, log_validation_loss
from megatron.varlen_training.model_family import GPT
from megatron.varlen_training.pretrain import pretrain
from megatron.varlen_training.resume.run_args_record import recorded_valid_samples, save_run_args
from megatron.varlen_training.run_description import sample_counts
from megatron.varlen_training.trainer import Trainer
from megatron.varlen_training.runtime_hooks import StepHooks
from tests.harness.extras import needs_extra
from tests.harness.metric_fakes import fake_metric_modules
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import TINY_GPT_ARGS, loss_owner_history, train_on_this_rank
from tests.unit_tests.varlen_training.datasets.indexed_corpus import write_corpus
from tools.probe_combinations import (
    EVAL, REFERENCE_LAYOUT, compare, launch, launch_resume, parse_cell,
)

RTOL = 1e-5
TIMEOUT_S = 120


# ---------------------------------------------------------------- which batches are read


class _MegatronValidIterator:
    """The reference: one iterator over validation global batches, as Megatron-LM's; every
    evaluation takes the next ``eval_iters`` global batches (its ``consumed_valid_samples``
    grows by ``eval_iters x global batch``), and a checkpoint stores that count, from which a
    resumed run re-creates the iterator whatever its --eval-interval."""

    def __init__(self, eval_iters: int, start_block: int = 0):
        self.eval_iters, self.next_batch = eval_iters, start_block * eval_iters

    def take(self) -> int:
        first, self.next_batch = self.next_batch, self.next_batch + self.eval_iters
        return first


GBS = 4


def _schedule(train_iters: int, eval_interval: int, eval_iters: int, start: int = 0,
              consumed_valid: int = 0, stop: int | None = None,
              start_eval_at_iter: int | None = None):
    """The first validation batch of each evaluation evaluation.py runs from iteration
    ``start`` (a resume, ``consumed_valid`` validation samples read before it) to ``stop``
    (default the end, with the end-of-training evaluations), as (iteration, first batch,
    split); and the validation samples read when it stops (what a checkpoint records)."""
    reads = []

    def fake_evaluate(run, state, provider, first_index, on_batch=None, num_batches=None):
        reads.append((state.iteration, first_index, provider))
        return None

    config = SimpleNamespace(eval_iters=eval_iters, eval_interval=eval_interval,
                             global_batch_size=GBS, train_iters=train_iters,
                             start_eval_at_iter=start_eval_at_iter, eval_batch_size=GBS)
    trainer = SimpleNamespace(run=SimpleNamespace(training=config),
                              state=training.TrainState(None, None, None, None, start,
                                                        consumed_valid_samples=consumed_valid),
                              writers=[], hooks=StepHooks(RuntimeConfig(), 0, 1, None))
    original, training.evaluate = training.evaluate, fake_evaluate
    try:
        for iteration in range(start + 1, (stop or train_iters) + 1):
            trainer.state.iteration = iteration
            evaluation.evaluate_in_loop(trainer, "valid")
        if stop is None:
            evaluation.evaluate_at_end(trainer, "valid", "test")
    finally:
        training.evaluate = original
    return reads, trainer.state.consumed_valid_samples


def _valid_reads(reads) -> list[tuple[int, int]]:
    return [(it, first) for it, first, source in reads if source == "valid"]


@pytest.mark.parametrize("train_iters,interval,eval_iters", [(7, 2, 3), (6, 2, 3), (5, 1, 2),
                                                             (3, 5, 1)])
def test_evaluations_read_the_next_validation_batches(train_iters, interval, eval_iters):
    reference = _MegatronValidIterator(eval_iters)
    expected = [(it, reference.take()) for it in range(1, train_iters + 1) if it % interval == 0]
    expected.append((train_iters, reference.take()))  # the end: after the in-loop one, too
    reads, consumed_valid = _schedule(train_iters, interval, eval_iters)
    assert _valid_reads(reads) == expected
    assert [(it, first) for it, first, source in reads if source == "test"] == \
        [(train_iters, 0)]
    assert consumed_valid == reference.next_batch * GBS  # the test split is not counted
    # The validation set is built for exactly these reads (Megatron-LM's eval sample count).
    args = _schedule_flags(train_iters, interval, eval_iters)
    assert reference.next_batch * args.global_batch_size == sample_counts(args)[1]


def _schedule_flags(train_iters: int, eval_interval: int, eval_iters: int) -> SimpleNamespace:
    """The validated flags run_description.sample_counts reads: an iteration-based run of
    global batches of GBS from sample 0, one micro-batch each."""
    return SimpleNamespace(train_samples=None, train_iters=train_iters,
                           eval_interval=eval_interval, eval_iters=eval_iters,
                           global_batch_size=GBS, num_microbatches=1, rampup_batch_size=None,
                           decrease_batch_size_if_needed=False, global_batch_anchor=None)


@pytest.mark.parametrize("resume_at", [2, 3, 4])
def test_a_resumed_run_reads_what_an_uninterrupted_one_reads(resume_at):
    straight, _ = _schedule(7, 2, 3)
    first_half, stored = _schedule(7, 2, 3, stop=resume_at)
    resumed, _ = _schedule(7, 2, 3, start=resume_at, consumed_valid=stored)
    assert first_half + resumed == straight


# (first interval, resumed interval, eval_iters, resumed at, train_iters): the resumed run
# evaluates more or less often than the one that saved.
CHANGED_INTERVALS = [(2, 1, 1, 4, 8), (2, 3, 2, 5, 12), (3, 2, 1, 6, 9), (1, 2, 2, 3, 12)]
REFUSED = {(2, 3, 2, 5, 12), (1, 2, 2, 3, 12)}  # counted by hand: they read past the split


@pytest.mark.parametrize("before,after,eval_iters,resume_at,train_iters", CHANGED_INTERVALS)
def test_a_resume_with_another_eval_interval_continues_megatron_lms_stream(
        before, after, eval_iters, resume_at, train_iters):
    """Megatron-LM's iterator does not care which --eval-interval the run resumes with: it
    continues after the samples the checkpoint records. (Derived from the iteration, as before
    they were recorded, the resumed run would start at another batch in every case here.)"""
    reference = _MegatronValidIterator(eval_iters)
    expected_first = [(it, reference.take()) for it in range(1, resume_at + 1)
                      if it % before == 0]
    first_half, stored = _schedule(train_iters, before, eval_iters, stop=resume_at)
    assert _valid_reads(first_half) == expected_first
    assert stored == reference.next_batch * GBS  # what the checkpoint records
    expected = [(it, reference.take()) for it in range(resume_at + 1, train_iters + 1)
                if it % after == 0]
    expected.append((train_iters, reference.take()))
    resumed, _ = _schedule(train_iters, after, eval_iters, start=resume_at,
                           consumed_valid=stored)
    assert _valid_reads(resumed) == expected
    derived_start = resume_at // after * eval_iters
    assert derived_start != stored // GBS, "the case would not tell the two apart"


@pytest.mark.parametrize("before,after,eval_iters,resume_at,train_iters", CHANGED_INTERVALS)
def test_resumed_evaluations_fit_the_validation_split_or_are_refused(
        before, after, eval_iters, resume_at, train_iters):
    """The start-up check refuses exactly the resumes whose reads (counted by the reference
    iterator) would pass the validation split this run builds (sample_counts)."""
    reference = _MegatronValidIterator(eval_iters)
    for it in range(1, resume_at + 1):
        if it % before == 0:
            reference.take()
    stored = reference.next_batch * GBS
    for it in range(resume_at + 1, train_iters + 1):
        if it % after == 0:
            reference.take()
    reference.take()  # the end of training
    args = _schedule_flags(train_iters, after, eval_iters)
    eval_samples = sample_counts(args)[1]
    config = SimpleNamespace(eval_iters=eval_iters, eval_interval=after,
                             global_batch_size=GBS, train_iters=train_iters,
                             start_eval_at_iter=None, eval_batch_size=GBS)
    fits = reference.next_batch * GBS <= eval_samples
    assert fits == ((before, after, eval_iters, resume_at, train_iters) not in REFUSED)
    if fits:
        evaluation.check_resumed_validation(config, resume_at, stored, eval_samples)
    else:
        with pytest.raises(CheckpointError, match="--eval-interval") as refused:
            evaluation.check_resumed_validation(config, resume_at, stored, eval_samples)
        assert "\n" not in str(refused.value)
        assert f"up to sample {reference.next_batch * GBS}" in str(refused.value)
        assert f"the {eval_samples} the validation split holds" in str(refused.value)


def test_no_evaluation_without_eval_iters():
    assert _schedule(4, 2, 0) == ([], 0)


# ---------------------------------------------------------------- the losses


def _direct_loss(model, dataset, indices: range) -> float:
    """Sum of the masked token losses over ``indices``' samples / their loss tokens, each
    sample alone through the model unpacked (float64 sums)."""
    total, tokens = torch.zeros((), dtype=torch.float64), torch.zeros((), dtype=torch.float64)
    with torch.no_grad(), eval_mode([model]):
        for index in indices:
            sample = dataset[index]
            n = sample["length"]
            losses = model(sample["tokens"][None, :n], sample["position_ids"][None, :n], None,
                           labels=sample["labels"][None, :n])
            mask = sample["loss_mask"][:n].double()
            total += (losses[0].double() * mask).sum()
            tokens += mask.sum()
    return (total / tokens).item()


def _run_and_direct_losses(argv: list[str]) -> dict:
    """pretrain() on this rank's group, then the direct losses with the trained model over the
    samples each evaluation must read (TRAIN_ITERS, EVAL: batches 0-1, 2-3 and test 0-1)."""
    run = parse_run_config(argv, world_size=torch.distributed.get_world_size())
    trainer = Trainer(run, GPT)
    try:
        history = pretrain(trainer)
        _, valid, test = build_split_datasets(run, trainer.tokenizer)
        model, batch = trainer.state.model[0], run.training.global_batch_size * EVAL_ITERS
        direct = {"validation_loss": _direct_loss(model, valid, range(0, batch)),
                  "end_validation_loss": _direct_loss(model, valid, range(batch, 2 * batch)),
                  "test_loss": _direct_loss(model, test, range(0, batch))}
        return {"history": history, "direct": direct,
                "owns_loss": history[0]["lm_loss"] is not None}
    finally:
        trainer.close()


TRAIN_ITERS, EVAL_ITERS = 2, 2
LENGTHS = json.dumps({"mode": "distribution", "type": "lognormal", "min_seq_len": 1,
                      "max_seq_len": 32, "mean_seq_len": 10, "lognormal_sigma": 1.0})
# Mock SFT samples: their lengths (loss tokens) differ, so a mean of batch means would not do.
EVALUATED = [*TINY_GPT_ARGS, "--train-iters", str(TRAIN_ITERS), "--eval-iters", str(EVAL_ITERS),
             "--eval-interval", str(TRAIN_ITERS), "--sft", "--sft-mock-dataset-config-json",
             LENGTHS, "--micro-batch-size", "1", "--sequence-packing",
             "--calculate-per-token-loss", "--position-embedding-type", "rope"]


# Megatron indexed data with a test share, packed on one rank (megatron-core's splits).
INDEXED = [*EVALUATED[EVALUATED.index("--train-iters"):], "--num-layers", "2",
           "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "32",
           "--global-batch-size", "4", "--lr", "1e-3", "--make-vocab-size-divisible-by", "32",
           "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "7",
           "--tokenizer-type", "ByteLevelTokenizer", "--split", "80,10,10"]
INDEXED = [flag for flag in INDEXED if flag not in ("--sft", "--sft-mock-dataset-config-json",
                                                    LENGTHS)]
RUNS = {"mock_sft_dp2": 2, "indexed_1rank": 1}


@pytest.fixture(scope="module", params=list(RUNS))
def evaluated(request, tmp_path_factory):
    argv = EVALUATED
    if request.param == "indexed_1rank":
        folder = tmp_path_factory.mktemp("indexed")
        write_corpus(str(folder / "docs"), 200, seed=3)
        argv = INDEXED + ["--data-path", str(folder / "docs"),
                          "--data-cache-path", str(folder / "cache")]
    results = run_distributed(_run_and_direct_losses, RUNS[request.param], args=(argv,),
                              timeout_s=TIMEOUT_S)
    owner = [r for r in results if r["owns_loss"]][-1]
    return owner["history"][-1], owner["direct"]


@pytest.mark.parametrize("key", ["validation_loss", "end_validation_loss", "test_loss"])
def test_evaluated_losses_equal_the_direct_per_token_mean(evaluated, key):
    reported, direct = evaluated
    assert reported[key] is not None
    assert abs(reported[key] - direct[key]) <= RTOL * abs(direct[key]), (key, reported, direct)


def test_each_evaluation_reads_other_samples(evaluated):
    _, direct = evaluated  # else equal losses above could come from the same samples
    assert len({round(value, 6) for value in direct.values()}) == 3, direct


# ---------------------------------------------------------------- layouts and resume


def test_dynamic_cp_evaluates_as_one_rank_unpacked():
    """tools/probe_combinations.py's cell sft_masks/d_dp2_cp2 with --eval (real SFT conversations,
    prompts masked; dynamic CP over 2x2 ranks): every validation and test loss equals the
    single-rank unpacked run's (the probe found every layout equal: docs/ARCHITECTURE.md)."""
    feature, layout, recompute = parse_cell("sft_masks/d_dp2_cp2")
    reference = launch(feature, REFERENCE_LAYOUT, "none", EVAL)
    run = launch(feature, layout, recompute, EVAL)
    assert reference["status"] == run["status"] == "ran", (reference, run)
    assert reference["history"][-1]["test_loss"] is None  # a real SFT file has no test split
    assert sum(step["validation_loss"] is not None for step in reference["history"]) == 1
    gap, where = compare(run["history"], reference["history"])
    assert gap <= RTOL, where


def test_a_resumed_run_validates_as_the_straight_one(tmp_path):
    """Half + save + load + half: the resumed half's in-loop validation reads the batches the
    straight run reads there, bit for bit (packed, one rank: the probe found DP2, dynamic CP
    over 2x2 ranks and PP2 with virtual stages equal too)."""
    run = launch_resume(*parse_cell("dense/p_single"), str(tmp_path), EVAL)
    assert run["status"] == "ran", run.get("error", run.get("reason"))
    assert [step["validation_loss"] is not None for step in run["history"]] == \
        [False, True, False, True]
    assert run["resumed"] == run["history"]


def _validation_reads(argv: list[str]) -> list[tuple[int, int]]:
    """pretrain() on this rank with the first validation / test batch of every evaluation
    recorded, as (iteration, first batch)."""
    reads, original = [], training.evaluate

    def recording(run, state, provider, first_index, on_batch=None, num_batches=None):
        reads.append((state.iteration, first_index))
        return original(run, state, provider, first_index, on_batch, num_batches)

    training.evaluate = recording
    try:
        train_on_this_rank(argv)
    finally:
        training.evaluate = original
    return reads


def _resumes_with_other_eval_intervals(folder: str) -> dict:
    """Saves after 2 of 4 iterations evaluating every 2nd, then resumes with --eval-interval 1
    (fits) and 4 (would read past the validation split); and reads a checkpoint written before
    consumed_valid_samples was recorded."""
    base = [*TINY_GPT_ARGS, "--train-iters", "4", "--micro-batch-size", "1",
            "--sequence-packing", "--eval-iters", "1"]
    results = {"first": _validation_reads(
        base + ["--eval-interval", "2", "--exit-interval", "2", "--save", folder])}
    with open(f"{folder}/iter_0000002/run_args.json", encoding="utf-8") as handle:
        results["recorded"] = json.load(handle)["consumed_valid_samples"]
    results["resumed"] = _validation_reads(base + ["--eval-interval", "1", "--load", folder])
    try:
        _validation_reads(base + ["--eval-interval", "4", "--load", folder])
    except CheckpointError as err:
        results["refused"] = str(err)
    old = parse_run_config(base + ["--eval-interval", "3"], world_size=1)
    os.makedirs(f"{folder}/old/iter_0000007")
    save_run_args(f"{folder}/old/iter_0000007", old, iteration=7)  # no validation count
    notes = []
    original, checkpoint_load.print_rank_0 = checkpoint_load.print_rank_0, notes.append
    try:
        results["derived"] = checkpoint.consumed_valid_samples_at(f"{folder}/old", 7, old)
    finally:
        checkpoint_load.print_rank_0 = original
    results["notes"] = notes
    return results


def test_a_resume_with_another_eval_interval_continues_the_recorded_stream(tmp_path):
    """Real checkpoints (one rank, packed): the checkpoint records the validation samples the
    reference iterator counted, the resumed run's evaluations continue after them with its own
    --eval-interval, a resume that would read past the validation split is refused in one
    line, and an older checkpoint derives the count from its iteration (and says so)."""
    result = run_distributed(_resumes_with_other_eval_intervals, 1, args=(str(tmp_path),),
                             timeout_s=TIMEOUT_S)[0]
    reference, gbs = _MegatronValidIterator(1), 4
    assert result["first"] == [(2, reference.take())]  # --exit-interval: no end evaluations
    assert result["recorded"] == reference.next_batch * gbs
    expected = [(3, reference.take()), (4, reference.take()), (4, reference.take()), (4, 0)]
    assert result["resumed"] == expected  # the last: the test split, from its start
    refused = result["refused"]
    assert "\n" not in refused and "--eval-interval 4" in refused, refused
    assert "read 4 validation samples" in refused and "holds" in refused, refused
    assert result["derived"] == 7 // 3 * 1 * gbs
    assert len(result["notes"]) == 1 and "records no consumed_valid_samples" in \
        result["notes"][0], result["notes"]


@pytest.mark.parametrize("value", ["12", -4, 2.5, True, [8]])
def test_a_garbled_recorded_count_is_one_line(tmp_path, value):
    """A run_args.json whose consumed_valid_samples is not a sample count: refused in one line
    naming the file and the value (never a wrong start or a traceback)."""
    (tmp_path / "run_args.json").write_text(json.dumps({"consumed_valid_samples": value}))
    with pytest.raises(CheckpointError) as refused:
        recorded_valid_samples(str(tmp_path))
    message = str(refused.value)
    assert "\n" not in message and "run_args.json" in message and repr(value) in message


def test_a_recorded_count_is_read_as_written(tmp_path):
    (tmp_path / "run_args.json").write_text(json.dumps({"consumed_valid_samples": 12}))
    assert recorded_valid_samples(str(tmp_path)) == 12
    (tmp_path / "run_args.json").write_text(json.dumps({"consumed_train_samples": 12}))
    assert recorded_valid_samples(str(tmp_path)) is None  # saved before it was recorded


def test_an_exit_condition_skips_the_end_of_training_evaluations():
    """As Megatron-LM: a run stopped by --exit-interval evaluates in the loop, not at the end
    (the resumed run does, once it reaches --train-iters)."""
    argv = [*TINY_GPT_ARGS, "--train-iters", "4", "--exit-interval", "2", "--eval-iters", "1",
            "--eval-interval", "2", "--micro-batch-size", "1", "--sequence-packing"]
    history = loss_owner_history(run_distributed(train_on_this_rank, 1, args=(argv,),
                                                 timeout_s=TIMEOUT_S))
    assert len(history) == 2 and history[-1]["validation_loss"] is not None
    assert "end_validation_loss" not in history[-1] and "test_loss" not in history[-1]


# ---------------------------------------------------------------- no side effects


DROPOUT = ["--hidden-dropout", "0.2", "--attention-dropout", "0.2"]


# MoE routers keep running statistics (global_aux_loss's token counts, the balancing losses'
# tracker the step reports): an evaluation must add nothing to them.
MOE = ["--num-experts", "4", "--moe-ffn-hidden-size", "16", "--disable-bias-linear",
       "--moe-router-load-balancing-type", "global_aux_loss", "--moe-aux-loss-coeff", "0.1",
       "--moe-z-loss-coeff", "0.01", "--calculate-per-token-loss"]


@pytest.mark.parametrize("model", [[], MOE], ids=["dense", "moe"])
def test_evaluating_leaves_training_alone(model):
    """Dropout on: an evaluation in train mode (or one that drew random numbers) would change
    the next iterations; the run evaluating after every iteration must train bit for bit as
    the one that never evaluates (every reported loss and the grad norm)."""
    base = [*TINY_GPT_ARGS, "--train-iters", "3", "--micro-batch-size", "1",
            "--sequence-packing", *DROPOUT, *model]
    runs = {}
    for name, extra in (("never", ["--eval-iters", "0"]),
                        ("every", ["--eval-iters", "1", "--eval-interval", "1"])):
        history = loss_owner_history(run_distributed(train_on_this_rank, 1, args=(base + extra,),
                                                     timeout_s=TIMEOUT_S))
        evaluated = [h.pop("validation_loss") is not None for h in history]
        assert evaluated == [name == "every"] * len(history)
        del history[-1]["end_validation_loss"], history[-1]["test_loss"]
        runs[name] = history
    assert runs["every"] == runs["never"]
    assert not model or "z_loss" in runs["never"][0], runs["never"][0]


# ---------------------------------------------------------------- keys and lines


def test_tensorboard_and_wandb_keys_are_megatron_lms(monkeypatch, tmp_path):
    calls, runs = [], []
    for name, module in fake_metric_modules(calls, runs).items():
        monkeypatch.setitem(sys.modules, name, module)
    tensorboard = metric_writers.TensorBoardMetricWriter(tmp_path)
    wandb = metric_writers.WandbMetricWriter("project")
    for writer in (tensorboard, wandb):
        writer.write_evaluation("validation", 2.5, 10, 160)
        writer.write_evaluation("test", 2.25, 10, 160)
    assert calls[1:] == [("lm loss validation", 2.5, 10),
                         ("lm loss validation vs samples", 2.5, 160),
                         ("lm loss test", 2.25, 10), ("lm loss test vs samples", 2.25, 160)]
    assert runs[0].logged == [(10, {"lm loss validation": 2.5}), (10, {"lm loss test": 2.25})]


def test_validation_ppl_keys_and_values_are_megatron_lms(monkeypatch, tmp_path):
    """--log-validation-ppl-to-tensorboard: Megatron-LM's ppl scalars, exp(min(20, loss)) (its
    cap, written out here), per iteration and vs samples; not without the flag, not to wandb."""
    calls, runs = [], []
    for name, module in fake_metric_modules(calls, runs).items():
        monkeypatch.setitem(sys.modules, name, module)
    with_ppl = metric_writers.TensorBoardMetricWriter(tmp_path, validation_ppl=True)
    with_ppl.write_evaluation("validation", 2.5, 10, 160)
    with_ppl.write_evaluation("test", 25.0, 10, 160)  # a diverged loss: Megatron-LM caps it
    assert calls[1:] == [("lm loss validation", 2.5, 10),
                         ("lm loss validation vs samples", 2.5, 160),
                         ("lm loss validation ppl", math.exp(2.5), 10),
                         ("lm loss validation ppl vs samples", math.exp(2.5), 160),
                         ("lm loss test", 25.0, 10), ("lm loss test vs samples", 25.0, 160),
                         ("lm loss test ppl", math.exp(20), 10),
                         ("lm loss test ppl vs samples", math.exp(20), 160)]
    del calls[:]
    metric_writers.TensorBoardMetricWriter(tmp_path).write_evaluation("validation", 2.5, 1, 4)
    assert [call[0] for call in calls[1:]] == ["lm loss validation",
                                               "lm loss validation vs samples"]
    run = parse_run_config([*TINY_GPT_ARGS, "--train-iters", "1", "--tensorboard-dir",
                            str(tmp_path), "--log-validation-ppl-to-tensorboard"], world_size=1)
    assert run.logging.log_validation_ppl_to_tensorboard


def _pretrain_with_tensorboard(argv: list[str], folder: str) -> dict:
    train_on_this_rank(argv + ["--tensorboard-dir", folder])
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(folder)
    events.Reload()
    return {tag: [(event.step, event.value) for event in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}


@needs_extra("metrics")
def test_pretrain_gpt_writes_validation_ppl_to_tensorboard(tmp_path):
    """The real event file of a run with --log-validation-ppl-to-tensorboard: each written
    validation loss has its perplexity, math.exp of it, at the same step (TensorBoard stores
    float32)."""
    argv = [*TINY_GPT_ARGS, "--train-iters", "2", "--eval-iters", "1", "--eval-interval", "1",
            "--micro-batch-size", "1", "--sequence-packing", "--log-validation-ppl-to-tensorboard"]
    scalars = run_distributed(_pretrain_with_tensorboard, 1, args=(argv, str(tmp_path)),
                              timeout_s=TIMEOUT_S)[0]
    for suffix in ("", " vs samples"):
        written = scalars[f"lm loss validation{suffix}"]
        ppl = scalars[f"lm loss validation ppl{suffix}"]
        assert len(written) == 3  # iterations 1, 2 and the end of training
        assert [step for step, _ in ppl] == [step for step, _ in written]
        assert all(abs(p - math.exp(loss)) <= 1e-6 * math.exp(loss)
                   for (_, p), (_, loss) in zip(ppl, written)), (ppl, written)
    assert [step for step, _ in scalars["lm loss validation vs samples"]] == [4, 8, 8]
    assert [step for step, _ in scalars["lm loss test ppl"]] == [2]


def test_validation_lines_are_megatron_lms(capsys, monkeypatch):
    printed = []
    monkeypatch.setattr("megatron.varlen_training.loop_steps.print_rank_last", printed.append)
    log_validation_loss(4, 2.0, evaluation.END_OF_TRAINING["test"])
    # Megatron-LM's evaluate_and_print_results: each field ends in '| ' (so does the line) and
    # each rule of dashes is one longer than the line.
    line = " validation loss at iteration 4 on test set | lm loss value: 2.000000E+00 | " \
           "lm loss PPL: 7.389056E+00 | "
    assert printed == ["-" * (len(line) + 1), line, "-" * (len(line) + 1)]


def test_a_validation_is_one_mapping_named_as_megatron_lms_lines(monkeypatch):
    """One split or several sets alike: {set name: loss}, each name the one its line and its
    metric writers' key carry (Megatron-LM's ``validation``, ``validation-wiki``)."""
    from megatron.varlen_training.validation_sets import ValidationSets

    printed, written = [], []
    monkeypatch.setattr("megatron.varlen_training.loop_steps.print_rank_last", printed.append)
    monkeypatch.setattr(training, "evaluate", lambda run, state, provider, *rest: provider.loss)
    config = SimpleNamespace(eval_iters=1, eval_batch_size=GBS)
    trainer = SimpleNamespace(run=SimpleNamespace(training=config),
                              state=training.TrainState(None, None, None, None, 2),
                              write_evaluation=lambda name, loss: written.append((name, loss)))
    split = SimpleNamespace(loss=1.5)
    assert evaluation._validate(trainer, split, "", verbose=False) == {"validation": 1.5}
    sets = ValidationSets(tuple(
        (suffix, SimpleNamespace(loss=loss, whole_split=True, num_batches=lambda: 1))
        for suffix, loss in (("-wiki", 2.0), ("-code", 3.0))))
    assert evaluation._validate(trainer, sets, "", verbose=False) == {
        "validation-wiki": 2.0, "validation-code": 3.0}
    assert written == [("validation", 1.5), ("validation-wiki", 2.0), ("validation-code", 3.0)]
    names = [line.split(" loss at ")[0].strip() for line in printed if " loss at " in line]
    assert names == ["validation", "validation-wiki", "validation-code"]
