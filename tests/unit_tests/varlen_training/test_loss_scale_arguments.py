"""Megatron-LM's fp16 loss-scaling flags reach megatron-core's optimizer config as given, with
Megatron-LM's defaults (which must be megatron-core's own OptimizerConfig defaults: a run
without the flags builds the scaler megatron-core would build), and are one-line refusals
without --fp16 or out of range. --fp16 itself needs CUDA, so its runs are parsed here as on a
GPU machine (torch.cuda.is_available patched); the scaler's behaviour on overflow is megatron-
core's, and the LR schedule's response to a skipped step is test_applied_lr_schedule.py's."""

import dataclasses

import pytest
import torch
from megatron.core.optimizer import OptimizerConfig as CoreOptimizerConfig

from megatron.varlen_training.arguments import ArgumentValidationError, parse_args
from megatron.varlen_training.config.from_flags import run_config
from megatron.varlen_training.training import core_optimizer_config
from tests.harness.training_runs import TINY_GPT_ARGS

SCALER_FIELDS = ("loss_scale", "initial_loss_scale", "min_loss_scale", "loss_scale_window",
                 "hysteresis")
BASE = TINY_GPT_ARGS + ["--train-iters", "2"]


def _core_config(argv, monkeypatch, gpu: bool = True) -> CoreOptimizerConfig:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    return core_optimizer_config(run_config(parse_args(BASE + argv, world_size=1)))


def test_without_the_flags_the_scaler_is_megatron_cores_default(monkeypatch):
    ours = _core_config(["--fp16"], monkeypatch)
    defaults = {field.name: field.default for field in dataclasses.fields(CoreOptimizerConfig)}
    assert {name: getattr(ours, name) for name in SCALER_FIELDS} == \
        {name: defaults[name] for name in SCALER_FIELDS}
    assert ours.fp16 and ours.params_dtype == torch.float16


def test_given_values_reach_megatron_cores_config(monkeypatch):
    ours = _core_config(["--fp16", "--initial-loss-scale", "65536", "--min-loss-scale", "4",
                         "--loss-scale-window", "50", "--hysteresis", "3"], monkeypatch)
    assert (ours.initial_loss_scale, ours.min_loss_scale, ours.loss_scale_window,
            ours.hysteresis, ours.loss_scale) == (65536.0, 4.0, 50.0, 3, None)
    assert _core_config(["--fp16", "--loss-scale", "1024"], monkeypatch).loss_scale == 1024.0


@pytest.mark.parametrize("argv, needle", [
    (["--loss-scale", "1024"], "--loss-scale 1024.0 needs --fp16"),
    (["--hysteresis", "4"], "--hysteresis 4 needs --fp16"),
    (["--fp16", "--min-loss-scale", "8", "--initial-loss-scale", "4"],
     "--min-loss-scale 8.0 exceeds --initial-loss-scale 4.0"),
    (["--fp16", "--hysteresis", "0"], "--hysteresis must be >= 1"),
    (["--fp16", "--loss-scale", "0"], "--loss-scale must be"),
])
def test_bad_loss_scale_flags_are_one_line(argv, needle, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ArgumentValidationError) as err:
        parse_args(BASE + argv, world_size=1)
    assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_megatron_lms_defaults_without_fp16_are_accepted(monkeypatch):
    """A megatron-wrap config lists every Megatron-LM flag at its default: not refused."""
    config = _core_config(["--initial-loss-scale", str(2.0**32), "--hysteresis", "2"],
                          monkeypatch, gpu=False)
    assert not config.fp16
