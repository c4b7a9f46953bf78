"""TensorBoard and wandb get Megatron-LM's scalars: its names, its two x-axes (the iteration, and
the consumed samples for ``... vs samples``), at the multiples of ``--tensorboard-log-interval``.
The names and rules are written here from Megatron-LM's ``training_log`` (read as facts), not
taken from metric_writers.py."""

import sys

import pytest

from tests.harness.metric_fakes import fake_metric_modules
from tests.harness.training_runs import TINY_GPT_ARGS
from megatron.varlen_training.arguments import ArgumentValidationError, parse_args
from megatron.varlen_training.config.from_flags import run_config
from megatron.varlen_training.config.logging import LoggingConfig
from megatron.varlen_training.iteration_metrics import IterationMetrics, to_json_record
from megatron.varlen_training.metric_writers import build_metric_writers

GBS = 8
# Megatron-LM's training_log: name -> the value it logs (here: the record key holding it).
MEGATRON_LM = {"learning-rate": "lr", "batch-size": "global_batch_size", "lm loss": "lm_loss",
               "loss-scale": "loss_scale", "grad-norm": "grad_norm"}


def _record(iteration: int, skipped: bool = False) -> dict:
    return to_json_record(IterationMetrics(
        iteration=iteration, train_iters=10, consumed_samples=GBS * iteration + 3,
        step_time_s=0.5, learning_rate=1e-3 / iteration, global_batch_size=GBS,
        lm_loss=5.0 - 0.25 * iteration, grad_norm=None if skipped else 0.1 * iteration,
        num_microbatches=2, tokens=100, seqlen_sum=100, seqlen_squared_sum=5000, flops=10**12,
        world_size=1, loss_scale=2.0 ** (16 - iteration), skipped=skipped))


def _writers(monkeypatch, tmp_path, interval: int):
    tensorboard, wandb_runs = [], []
    for name, module in fake_metric_modules(tensorboard, wandb_runs).items():
        monkeypatch.setitem(sys.modules, name, module)
    logging = LoggingConfig(log_interval=1, log_metrics_jsonl=None,
                            tensorboard_dir=str(tmp_path), wandb_project="p", wandb_exp_name=None,
                            wandb_save_dir=None, wandb_mode="offline",
                            tensorboard_log_interval=interval)
    writers = build_metric_writers(logging, train_iters=10, console=False)
    records = [_record(i, skipped=i == 4) for i in range(1, 7)]
    for record in records:
        for writer in writers:
            writer.write(record["iteration"], record)
    return records, tensorboard, wandb_runs[0].logged


def test_tensorboard_gets_megatron_lms_names_on_both_axes(monkeypatch, tmp_path):
    records, tensorboard, _ = _writers(monkeypatch, tmp_path, interval=1)
    scalars = {}
    for call in tensorboard[1:]:
        scalars.setdefault(call[0], []).append(call[1:])
    for name, key in MEGATRON_LM.items():
        logged = [r for r in records if r[key] is not None]  # a skipped step has no grad norm
        assert scalars[name] == [(r[key], r["iteration"]) for r in logged], name
        assert scalars[f"{name} vs samples"] == [(r[key], r["consumed_samples"]) for r in logged]
    assert len(scalars["grad-norm"]) == len(records) - 1


def test_wandb_gets_megatron_lms_names_and_samples_vs_steps(monkeypatch, tmp_path):
    records, _, logged = _writers(monkeypatch, tmp_path, interval=1)
    assert [step for step, _ in logged] == [r["iteration"] for r in records]
    for (_, values), record in zip(logged, records):
        assert values["samples vs steps"] == record["consumed_samples"]
        for name, key in MEGATRON_LM.items():
            assert values.get(name) == record[key], name


def test_tensorboard_log_interval_picks_its_multiples(monkeypatch, tmp_path):
    _, tensorboard, logged = _writers(monkeypatch, tmp_path, interval=3)
    steps = {call[2] for call in tensorboard[1:] if not call[0].endswith(" vs samples")}
    assert steps == {3, 6}
    assert [step for step, _ in logged] == [3, 6]


def test_tensorboard_log_interval_is_megatron_lms_flag():
    run = run_config(parse_args(TINY_GPT_ARGS + ["--train-iters", "2"], world_size=1))
    assert run.logging.tensorboard_log_interval == 1  # Megatron-LM's default
    run = run_config(parse_args(TINY_GPT_ARGS + ["--train-iters", "2",
                                                 "--tensorboard-log-interval", "5"], world_size=1))
    assert run.logging.tensorboard_log_interval == 5
    with pytest.raises(ArgumentValidationError, match="--tensorboard-log-interval must be >= 1"):
        parse_args(TINY_GPT_ARGS + ["--train-iters", "2", "--tensorboard-log-interval", "0"],
                   world_size=1)
