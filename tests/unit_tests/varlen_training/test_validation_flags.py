"""Megatron-LM's evaluation, exit-signal and init flags (validation_arguments.py) against
independent references:

- ``--skip-train --load``: the validation and test losses of a checkpoint equal the lines the
  training run itself reported at that iteration (its first validation, its end-of-training
  test), no step runs and nothing is written into the checkpoint folder; Megatron-LM's log
  lines; no optimizer state is loaded (Megatron-LM's --no-load-optim);
- ``--exit-signal``: the chosen signal is caught by ``--exit-signal-handler``, and SIGTERM then
  keeps its own handling (a handler installed before the run sees it);
- ``--encoder-seq-length`` is ``--seq-length`` (the same run config), refused beside a
  different ``--seq-length``; the evaluation batch sizes accepted at the training ones;
- every refused flag is one line naming the flag (exit code 2 through the parser).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import signal

import pytest
import torch

from megatron.varlen_training import validation_arguments
from megatron.varlen_training.arguments import parse_args
from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.datasets.builder import build_split_datasets
from megatron.varlen_training.evaluation import SKIPPING_TRAINING
from megatron.varlen_training.exit_conditions import ExitConditions
from megatron.varlen_training.flag_errors import ArgumentValidationError
from megatron.varlen_training.log import get_logger
from megatron.varlen_training.model_family import GPT
from megatron.varlen_training.pretrain import pretrain
from megatron.varlen_training.trainer import Trainer
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import TINY_GPT_ARGS, tiny_packed_config
from tests.unit_tests.varlen_training.datasets.indexed_corpus import write_corpus

TIMEOUT_S = 120
RTOL = 1e-6
BASE = [*TINY_GPT_ARGS, "--train-iters", "2"]


# ---------------------------------------------------------------- --skip-train


SAVE_AT = 2
# Packed mock SFT on DP2: the first validation (iteration 2) reads validation batches 0-1, the
# batches a --skip-train evaluation reads; the test split is read from 0 by both.
TRAINED = [*TINY_GPT_ARGS, "--train-iters", str(SAVE_AT), "--eval-interval", str(SAVE_AT),
           "--eval-iters", "2", "--save-interval", str(SAVE_AT), "--sft", "--micro-batch-size",
           "1", "--sequence-packing", "--calculate-per-token-loss"]


ITERATION_LINE = re.compile(r"iteration +\d+/ *\d+ \|")  # Megatron-LM's iteration line


class _Lines(logging.Handler):
    """Collects the log lines of this process."""

    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def _files(folder: str) -> dict[str, float]:
    return {os.path.join(root, name): os.path.getmtime(os.path.join(root, name))
            for root, _, names in os.walk(folder) for name in names}


def _pretrain(argv: list[str]) -> tuple[list[dict], list[str]]:
    lines, logger = _Lines(), get_logger()
    logger.addHandler(lines)
    trainer = Trainer(parse_run_config(argv, world_size=torch.distributed.get_world_size()), GPT)
    try:
        return pretrain(trainer), lines.lines
    finally:
        trainer.close()
        logger.removeHandler(lines)


def _train_then_skip_train(folder: str) -> dict:
    trained, trained_lines = _pretrain([*TRAINED, "--save", folder])
    torch.distributed.barrier()
    before = _files(folder)
    torch.distributed.barrier()
    evaluated, lines = _pretrain([*TRAINED, "--load", folder, "--skip-train"])
    torch.distributed.barrier()
    return {"trained": trained, "evaluated": evaluated, "lines": lines,
            "trained_lines": trained_lines,
            "unchanged": _files(folder) == before, "rank": torch.distributed.get_rank()}


@pytest.fixture(scope="module")
def skip_train_run(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("skip_train"))
    results = run_distributed(_train_then_skip_train, 2, args=(folder,), timeout_s=TIMEOUT_S)
    # the last rank owns the loss (and prints its lines); rank 0 prints the others
    return {**results[-1], **{key: [line for result in results for line in result[key]]
                              for key in ("lines", "trained_lines")},
            "unchanged": all(result["unchanged"] for result in results)}


def test_skip_train_reports_the_training_runs_losses_at_the_checkpoint(skip_train_run):
    trained, evaluated = skip_train_run["trained"], skip_train_run["evaluated"]
    assert len(trained) == SAVE_AT and len(evaluated) == 1
    reference = {"end_validation_loss": trained[SAVE_AT - 1]["validation_loss"],
                 "test_loss": trained[-1]["test_loss"]}
    assert evaluated[0]["lm_loss"] is None and evaluated[0]["grad_norm"] is None  # no step
    for key, expected in reference.items():
        assert expected is not None, (key, trained)
        assert abs(evaluated[0][key] - expected) <= RTOL * abs(expected), (key, evaluated, trained)
    # the end-of-training validation read other batches: a loss equal to it would not do
    assert trained[-1]["end_validation_loss"] != reference["end_validation_loss"]


def test_skip_train_writes_nothing_and_logs_megatron_lms_lines(skip_train_run):
    assert skip_train_run["unchanged"]
    lines = skip_train_run["lines"]
    assert SKIPPING_TRAINING in lines and validation_arguments.NO_LOAD_OPTIM_WARNING in lines
    assert any(f"validation loss at iteration {SAVE_AT} on validation set" in line
               for line in lines), lines
    assert any(f"validation loss at iteration {SAVE_AT} on test set" in line for line in lines)
    def iteration_lines(lines):
        return [line for line in lines if ITERATION_LINE.search(line)]

    assert iteration_lines(skip_train_run["trained_lines"])  # the pattern finds them
    assert not iteration_lines(lines)  # no step ran


def test_skip_train_builds_the_validation_split_for_one_evaluation():
    args = parse_args([*BASE, "--eval-iters", "3", "--eval-interval", "1", "--skip-train"],
                      world_size=1)
    assert args.eval_samples == 3 * args.global_batch_size and args.no_load_optim
    assert parse_run_config([*BASE, "--skip-train"], world_size=1).training.skip_train


# ---------------------------------------------------------------- --exit-signal


class _Seen:
    def __init__(self):
        self.signals: list[int] = []

    def __call__(self, signum, frame):
        del frame
        self.signals.append(signum)


@pytest.mark.parametrize("chosen", ["SIGUSR1", "SIGTERM"])
def test_the_exit_signal_is_caught_and_sigterm_otherwise_left_alone(chosen):
    training = parse_run_config([*BASE, "--exit-signal-handler", "--exit-signal", chosen],
                                world_size=1).training
    before = _Seen()
    previous = {sig: signal.signal(sig, before) for sig in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        with ExitConditions.of(training) as exits:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGUSR1)
            caught = exits.catcher.received
        assert caught == signal.Signals[chosen]
        other = signal.SIGTERM if chosen == "SIGUSR1" else signal.SIGUSR1
        assert before.signals == [other]  # the other signal kept the handler it had
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def test_sigint_is_caught_whatever_the_exit_signal():
    training = parse_run_config([*BASE, "--exit-signal-handler", "--exit-signal", "SIGUSR2"],
                                world_size=1).training
    with ExitConditions.of(training) as exits:
        os.kill(os.getpid(), signal.SIGINT)
        assert exits.catcher.received == signal.SIGINT


# ---------------------------------------------------------------- accepted and refused


def test_encoder_seq_length_is_seq_length():
    spelled = [flag if flag != "--seq-length" else "--encoder-seq-length" for flag in BASE]
    assert parse_run_config(spelled, world_size=1) == parse_run_config(BASE, world_size=1)
    assert "_seq_length_spellings" not in vars(parse_args(spelled, world_size=1))
    with pytest.raises(ArgumentValidationError, match="--encoder-seq-length 32 and "
                                                      "--seq-length 64 contradict"):
        parse_args([*spelled, "--seq-length", "64"], world_size=1)
    parse_args([*spelled, "--seq-length", "32"], world_size=1)  # no contradiction
    parse_args([*BASE, "--seq-length", "64"], world_size=1)  # argparse's last one wins


def test_eval_batch_sizes_default_to_the_training_ones():
    same = parse_run_config([*BASE, "--eval-micro-batch-size", "2", "--eval-global-batch-size",
                             "4"], world_size=1)
    assert same == parse_run_config(BASE, world_size=1)
    assert same.training.eval_batch_size == 4
    with pytest.raises(ArgumentValidationError, match="^--eval-micro-batch-size 1 differs"):
        parse_args([*BASE, "--eval-micro-batch-size", "1"], world_size=1)
    with pytest.raises(ArgumentValidationError, match="^--eval-global-batch-size 5 is not "
                                                      "divisible by --micro-batch-size 2"):
        parse_args([*BASE, "--eval-global-batch-size", "5"], world_size=1)
    args = parse_args([*BASE, "--eval-global-batch-size", "8", "--eval-iters", "3"],
                      world_size=1)  # the splits are built for 8-sample batches
    assert args.test_samples == 3 * 8 and args.eval_samples == (2 // 1000 + 1) * 3 * 8


def test_an_eval_global_batch_size_evaluates_the_samples_it_covers():
    """Packed: --eval-global-batch-size 8 with --eval-iters 1 reads the samples that batches
    of 4 with --eval-iters 2 read (0-7 and 8-15 of the validation split, 0-7 of the test
    split); each loss equals the per-sample float64 mean over them (test_evaluation.py's)."""
    from tests.unit_tests.varlen_training.test_evaluation import (
        EVALUATED, _run_and_direct_losses,
    )

    argv = [*EVALUATED, "--eval-global-batch-size", "8", "--eval-iters", "1"]
    results = run_distributed(_run_and_direct_losses, 1, args=(argv,), timeout_s=TIMEOUT_S)
    owner = [result for result in results if result["owns_loss"]][-1]
    reported, direct = owner["history"][-1], owner["direct"]
    for key in ("validation_loss", "end_validation_loss", "test_loss"):
        assert abs(reported[key] - direct[key]) <= 1e-5 * abs(direct[key]), (key, reported)


REFUSED = [["--skip-train", "--save-hf", "/tmp/hf"], ["--decoder-seq-length", "32"],
           ["--data-parallel-random-init"], ["--exit-signal", "SIGUSR1"],
           ["--exit-signal-handler", "--exit-signal", "SIGKILL"]]


@pytest.mark.parametrize("given", REFUSED, ids=lambda given: " ".join(given))
def test_refused_flags_are_one_line_naming_the_flag(given):
    with pytest.raises(ArgumentValidationError) as refused:
        parse_args([*BASE, *given], world_size=1)
    message = str(refused.value)
    assert "\n" not in message and given[-1 if given[-1].startswith("SIG") else 0] in message


def test_the_dataloader_signal_flag_changes_nothing():
    assert parse_run_config([*BASE, "--exit-signal-handler-for-dataloader"], world_size=1) \
        == parse_run_config(BASE, world_size=1)


# ---------------------------------------------------------------- loader workers


class _Numbers(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, index: int) -> dict:
        return {"index": index}


def _read_after_signalling_the_worker(signal_handler: bool) -> list[int]:
    """Starts a --num-workers reader (as the loop does: inside the exit conditions), sends the
    exit signal to its worker process, and reads on past what the worker had read ahead."""
    import psutil

    from megatron.varlen_training.datasets.sample_reader import SampleReader

    this = psutil.Process()
    others = {child.pid for child in this.children()}  # e.g. the test harness's fork server
    with ExitConditions(signal_handler=signal_handler, exit_signal=signal.SIGUSR1):
        reader = SampleReader(_Numbers(), lambda i: [i], len(_Numbers()), num_workers=1)
        try:
            read = [sample["index"] for sample in reader.read(0)]
            workers = [child for child in this.children() if child.pid not in others
                       and "multiprocessing" not in " ".join(child.cmdline())]
            assert len(workers) == 1, workers  # the reader's one worker, nothing else
            os.kill(workers[0].pid, signal.SIGUSR1)
            psutil.wait_procs(workers, timeout=1)
            for iteration in range(1, 20):  # more than the worker read ahead
                read += [sample["index"] for sample in reader.read(iteration)]
            return read
        finally:
            reader.close()


def test_loader_workers_keep_reading_through_the_exit_signal():
    """Megatron-LM installs its signal handler in each loader worker under
    --exit-signal-handler (its --exit-signal-handler-for-dataloader is read nowhere). Here the
    workers fork from a process whose handler is already installed, and keep it: a scheduler's
    signal to every process of the job leaves them reading. Without the handler the signal
    kills the worker, and the read fails: the check sees a worker's death."""
    assert _read_after_signalling_the_worker(signal_handler=True) == list(range(20))
    with pytest.raises(RuntimeError, match="worker"):
        _read_after_signalling_the_worker(signal_handler=False)


# ---------------------------------------------------------------- --full-validation


FULL = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "32", "--global-batch-size", "4", "--micro-batch-size", "1",
        "--lr", "1e-3", "--make-vocab-size-divisible-by", "32", "--hidden-dropout", "0",
        "--attention-dropout", "0", "--seed", "7", "--log-interval", "1",
        "--tokenizer-type", "ByteLevelTokenizer", "--split", "80,10,10",
        "--train-iters", "2", "--eval-interval", "2", "--eval-iters", "1",
        "--sequence-packing", "--calculate-per-token-loss", "--full-validation"]
FULL_DOCS = 66  # a validation split whose sample count is no multiple of 4 (checked below)


def _full_validation_and_direct_loss(argv: list[str]) -> dict:
    """pretrain() with --full-validation, then the float64 per-token mean over every sample of
    the validation split, each alone through the trained model unpacked."""
    from tests.unit_tests.varlen_training.test_evaluation import _direct_loss

    run = parse_run_config(argv, world_size=torch.distributed.get_world_size())
    trainer = Trainer(run, GPT)
    try:
        history = pretrain(trainer)
        _, valid, _ = build_split_datasets(run, trainer.tokenizer)
        return {"history": history, "num_valid": len(valid),
                "direct": _direct_loss(trainer.state.model[0], valid, range(len(valid)))}
    finally:
        trainer.close()


def test_full_validation_is_the_mean_over_every_validation_sample(tmp_path):
    """DP2, packed: the in-loop and the end-of-training validation (same model, iteration 2)
    both read the whole validation split, its last global batch partial and split unevenly
    over the two DP ranks; the loss equals the one-sample-at-a-time float64 reference."""
    write_corpus(str(tmp_path / "docs"), FULL_DOCS, seed=3)
    argv = [*FULL, "--data-path", str(tmp_path / "docs"), "--data-cache-path",
            str(tmp_path / "cache")]
    result = run_distributed(_full_validation_and_direct_loss, 2, args=(argv,),
                             timeout_s=TIMEOUT_S)[-1]
    gbs = 4
    assert result["num_valid"] > gbs and result["num_valid"] % gbs, result["num_valid"]
    last = result["history"][-1]
    for key in ("validation_loss", "end_validation_loss"):
        assert abs(last[key] - result["direct"]) <= 1e-5 * abs(result["direct"]), (key, result)


@pytest.mark.parametrize("extra, needle", [
    (["--mock-data"], "--mock-data"),
    (["--eval-iters", "0"], "--eval-iters 0"),
])
def test_full_validation_refuses_what_has_no_whole_split(extra, needle):
    evaluating = [*BASE, "--eval-iters", "1", "--full-validation"]  # BASE has mock data
    with pytest.raises(ArgumentValidationError, match=needle):
        parse_args([*evaluating, "--sequence-packing", "--micro-batch-size", "1", *extra],
                   world_size=1)
    with pytest.raises(ArgumentValidationError, match="needs --sequence-packing"):
        parse_args(evaluating, world_size=1)


@pytest.mark.parametrize("key", ["skip_train", "full_validation", "multiple_validation_sets"])
def test_megatron_wrap_refuses_the_loops_evaluation_keys(key):
    """The facade's loop is the caller's: pretrain_gpt.py's evaluation flags would do nothing."""
    from megatron.wrap.config import ConfigError, build_config
    from megatron.wrap.runtime import run_config_of

    config = tiny_packed_config(global_batch_size=4, train_iters=3)
    config["training"][key] = True
    with pytest.raises(ConfigError, match=f"'{key}'.*megatron.wrap"):
        run_config_of(build_config(config), world_size=1)
    config["training"][key] = False
    run_config_of(build_config(config), world_size=1)


@pytest.mark.parametrize("per_split", [False, True])
def test_full_validation_refuses_a_weighted_blend(per_split):
    """megatron-core samples a weighted blend by weight to the requested count: no whole split;
    an unweighted one is one epoch of each dataset, which one requested sample builds."""
    from types import SimpleNamespace

    from megatron.varlen_training.datasets.indexed import whole_split_request

    def config(blend):
        return SimpleNamespace(blend=None, blend_per_split=[None, blend, None]) if per_split \
            else SimpleNamespace(blend=blend, blend_per_split=None)

    with pytest.raises(ValueError, match="weighted --(valid-)?data-path blend"):
        whole_split_request(config((["a", "b"], [0.3, 0.7])))
    assert whole_split_request(config((["a", "b"], None))) == 1
    if per_split:  # megatron-core builds one --valid-data-path dataset plainly, weight or not
        assert whole_split_request(config((["a"], [1.0]))) == 1
    else:  # but blends a weighted --data-path, one dataset included
        with pytest.raises(ValueError, match="weighted --data-path blend"):
            whole_split_request(config((["a"], [1.0])))


# ---------------------------------------------------------------- --start-eval-at-iter


class _MegatronLMEvaluations:
    """The reference: Megatron-LM's loop, evaluating after each --eval-interval multiple from
    --start-eval-at-iter on and once at the end, each the next --eval-iters validation
    batches."""

    def __init__(self, train_iters: int, interval: int, eval_iters: int, start: int):
        evaluated_after = [iteration for iteration in range(1, train_iters + 1)
                           if iteration % interval == 0 and iteration >= start]
        evaluated_after.append(train_iters)  # the end of training, after the in-loop one too
        self.reads = [(iteration, k * eval_iters) for k, iteration in enumerate(evaluated_after)]
        self.batches_read = len(evaluated_after) * eval_iters


@pytest.mark.parametrize("train_iters, interval, eval_iters, start", [
    (7, 2, 3, 3), (7, 2, 3, 4), (6, 2, 1, 100), (5, 1, 2, 0), (8, 3, 2, 6)])
def test_start_eval_at_iter_skips_the_early_evaluations(train_iters, interval, eval_iters, start):
    from tests.unit_tests.varlen_training.test_evaluation import GBS, _schedule, _valid_reads

    reference = _MegatronLMEvaluations(train_iters, interval, eval_iters, start)
    reads, consumed = _schedule(train_iters, interval, eval_iters, start_eval_at_iter=start)
    assert _valid_reads(reads) == reference.reads
    assert consumed == reference.batches_read * GBS
    args = parse_args([*BASE[:-1], str(train_iters), "--eval-interval", str(interval),
                       "--eval-iters", str(eval_iters), "--global-batch-size", str(GBS),
                       "--start-eval-at-iter", str(start)], world_size=1)
    assert args.eval_samples == reference.batches_read * GBS  # built for exactly these reads


def _megatron_lm_evaluates_after(iteration: int, interval: int, start: int | None) -> bool:
    """Megatron-LM main's loop condition (training.py), given validation data."""
    return iteration % interval == 0 and (start is None or iteration >= start)


def test_the_evaluation_count_counts_the_evaluated_iterations():
    """The predicate is Megatron-LM's condition, and the count of evaluations up to an
    iteration is the predicate's, enumerated over every iteration before it."""
    from megatron.varlen_training.evaluation import in_loop_evaluation_due
    from megatron.varlen_training.run_description import evaluates_after, in_loop_evaluations

    last = 30
    for interval in range(1, 6):
        for start in (None, *range(0, 13)):
            due = [evaluates_after(i, interval, start) for i in range(1, last + 1)]
            assert due == [_megatron_lm_evaluates_after(i, interval, start)
                           for i in range(1, last + 1)], (interval, start)
            counts = [in_loop_evaluations(i, interval, start) for i in range(last + 1)]
            assert counts == [sum(due[:i]) for i in range(last + 1)], (interval, start)
    config = parse_run_config([*BASE, "--eval-interval", "2", "--eval-iters", "1",
                               "--start-eval-at-iter", "3"], world_size=1).training
    assert [i for i in range(1, 9) if in_loop_evaluation_due(config, i)] == [4, 6, 8]


@pytest.mark.parametrize("resume_at", [2, 4, 5])
def test_a_resume_with_start_eval_at_iter_reads_what_a_straight_run_reads(resume_at):
    """Also from a checkpoint that records no count: the count derived from its iteration is
    the one the straight run had read (Megatron-LM's derivation subtracts one evaluation too
    many when the start is an --eval-interval multiple)."""
    from megatron.varlen_training.run_description import in_loop_evaluations
    from tests.unit_tests.varlen_training.test_evaluation import GBS, _schedule

    straight, _ = _schedule(7, 2, 3, start_eval_at_iter=4)
    first, stored = _schedule(7, 2, 3, stop=resume_at, start_eval_at_iter=4)
    assert stored == in_loop_evaluations(resume_at, 2, 4) * 3 * GBS
    rest, _ = _schedule(7, 2, 3, start=resume_at, consumed_valid=stored, start_eval_at_iter=4)
    assert first + rest == straight


# ---------------------------------------------------------------- --multiple-validation-sets


def _sets_and_direct_losses(argv: list[str], prefixes: list[str]) -> dict:
    """pretrain() with each prefix a validation set, then each set's float64 per-sample mean
    over the whole validation split a run with that prefix alone builds."""
    from tests.unit_tests.varlen_training.test_evaluation import _direct_loss

    run = parse_run_config(argv, world_size=torch.distributed.get_world_size())
    trainer = Trainer(run, GPT)
    lines, logger = _Lines(), get_logger()
    logger.addHandler(lines)
    try:
        history = pretrain(trainer)
        direct = {}
        for name, prefix in zip(("wiki", "code"), prefixes):
            base = [flag for flag in argv[:argv.index("--valid-data-path")]
                    if flag not in ("--multiple-validation-sets", "--validation-set-names",
                                    "wiki", "code")]
            alone = parse_run_config([*base, "--valid-data-path", prefix],
                                     world_size=torch.distributed.get_world_size())
            _, valid, _ = build_split_datasets(alone, trainer.tokenizer)
            direct[f"-{name}"] = _direct_loss(trainer.state.model[0], valid, range(len(valid)))
        return {"history": history, "direct": direct, "lines": lines.lines}
    finally:
        logger.removeHandler(lines)
        trainer.close()


def _tensorboard_scalars(folder: str) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(folder)
    events.Reload()
    return {tag: [event.value for event in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}


def test_each_validation_set_is_evaluated_alone(tmp_path):
    """Two --valid-data-path sets (different corpora): each set's loss, in the loop and at the
    end, equals the whole-split float64 reference of a run with that set alone; the lines and
    TensorBoard tags carry the names, as Megatron-LM's."""
    prefixes = []
    for name, seed in (("train", 3), ("wiki", 5), ("code", 9)):
        write_corpus(str(tmp_path / name), 40 if name != "train" else 60, seed=seed)
        prefixes.append(str(tmp_path / name))
    argv = [flag for flag in FULL if flag not in ("--split", "80,10,10")]
    # the TensorBoard keys too where the [metrics] extra is installed
    tensorboard = ["--tensorboard-dir", str(tmp_path / "tb")] \
        if importlib.util.find_spec("tensorboard") else []
    argv += [*tensorboard, "--data-cache-path", str(tmp_path / "cache"),
             "--train-data-path", prefixes[0],
             "--multiple-validation-sets", "--validation-set-names", "wiki", "code",
             "--valid-data-path", *prefixes[1:]]
    result = run_distributed(_sets_and_direct_losses, 1, args=(argv, prefixes[1:]),
                             timeout_s=TIMEOUT_S)[0]
    last, direct = result["history"][-1], result["direct"]
    assert direct["-wiki"] != direct["-code"]
    for key in ("validation_loss", "end_validation_loss"):  # keyed by Megatron-LM's set names
        assert set(last[key]) == {"validation-wiki", "validation-code"}, last
        for suffix, expected in direct.items():
            assert abs(last[key][f"validation{suffix}"] - expected) <= 1e-5 * abs(expected), \
                (key, suffix)
    for name in ("wiki", "code"):
        assert any(line.startswith(f" validation-{name} loss at iteration 2 on validation set")
                   for line in result["lines"]), result["lines"]
    if not tensorboard:
        return
    scalars = _tensorboard_scalars(str(tmp_path / "tb"))
    for name in ("wiki", "code"):
        for tag in (f"lm loss validation-{name}", f"lm loss validation-{name} vs samples"):
            assert len(scalars[tag]) == 2, scalars  # in the loop and at the end
    assert "lm loss validation" not in scalars  # no blend of the sets is evaluated


@pytest.mark.parametrize("extra, needle", [
    (["--validation-set-names", "a"], "needs --multiple-validation-sets"),
    (["--multiple-validation-sets"], "needs --full-validation"),
    (["--multiple-validation-sets", "--full-validation", "--valid-data-path", "0.5", "a", "0.5",
      "b"], "weighted --valid-data-path 0.5 a 0.5 b"),
    (["--multiple-validation-sets", "--full-validation", "--valid-data-path", "a", "b",
      "--validation-set-names", "x"], "gives 1 names for 2"),
])
def test_validation_sets_refuse_what_megatron_lm_refuses(extra, needle):
    indexed = [flag for flag in FULL if flag not in ("--split", "80,10,10", "--full-validation")]
    with pytest.raises(ArgumentValidationError, match=needle):
        parse_args([*indexed, "--train-data-path", "t", *extra], world_size=1)
