"""Megatron-LM's sample-based schedule flags (--train-samples, --lr-warmup-samples,
--lr-decay-samples, --lr-warmup-fraction): the exclusions, the iteration count derived from
samples, and the LR curve megatron-core's scheduler then follows, against hand-computed values.
The training runs (packing on) are in test_sample_schedule_training.py."""

import pytest
import torch

from megatron.varlen_training.arguments import ArgumentValidationError, parse_args
from megatron.varlen_training.config.from_flags import run_config
from megatron.varlen_training.training import build_scheduler
from tests.harness.training_runs import TINY_GPT_ARGS

GBS = 4  # TINY_GPT_ARGS' --global-batch-size
LR = 1e-3  # TINY_GPT_ARGS' --lr


def _run(*extra):
    return run_config(parse_args(TINY_GPT_ARGS + list(extra), world_size=1))


def _lr_curve(run, num_steps: int) -> list[float]:
    """The LR after each of ``num_steps`` steps of one global batch, from megatron-core's
    scheduler as the training step drives it."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)
    scheduler = build_scheduler(run, optimizer)
    curve = []
    for _ in range(num_steps):
        scheduler.step(increment=run.training.global_batch_size)
        curve.append(optimizer.param_groups[0]["lr"])
    return curve


@pytest.mark.parametrize("train_samples, iters", [(12, 3), (13, 3), (15, 3), (16, 4), (4, 1)])
def test_iterations_are_whole_global_batches_of_the_samples(train_samples, iters):
    run = _run("--train-samples", str(train_samples))
    assert run.training.train_iters == iters
    assert run.data.train_samples == train_samples  # the datasets' size, as Megatron-LM's
    assert run.optimizer.lr_decay_steps == train_samples  # Megatron-LM: decay over all of them


def test_sample_based_run_says_its_iterations_as_megatron_lm(capsys):
    _lr_curve(_run("--train-samples", "13"), 0)
    assert "setting training iterations to 3" in capsys.readouterr().out
    _lr_curve(_run("--train-iters", "3"), 0)
    assert "setting training iterations" not in capsys.readouterr().out


def test_sample_flags_equal_their_iteration_equivalent():
    by_iters = _run("--train-iters", "5", "--lr-warmup-iters", "2", "--lr-decay-iters", "4")
    by_samples = _run("--train-samples", "20", "--lr-warmup-samples", "8",
                      "--lr-decay-samples", "16")
    for key in ("lr_warmup_steps", "lr_decay_steps", "wd_incr_steps"):
        assert getattr(by_iters.optimizer, key) == getattr(by_samples.optimizer, key), key
    assert by_iters.training.train_iters == by_samples.training.train_iters == 5
    assert _lr_curve(by_iters, 5) == _lr_curve(by_samples, 5)


def test_warmup_fraction_follows_the_hand_computed_curve():
    """--train-samples 24, fraction 0.25: warm-up over 6 samples, linear decay to 0 over the
    remaining 18. After step k (4k samples): k=1 -> 4/6; then 1 - (4k - 6) / 18."""
    expected = [LR * 4 / 6, LR * (1 - 2 / 18), LR * (1 - 6 / 18), LR * (1 - 10 / 18),
                LR * (1 - 14 / 18), LR * (1 - 18 / 18)]
    for run in (_run("--train-samples", "24", "--lr-warmup-fraction", "0.25"),
                _run("--train-iters", "6", "--lr-warmup-fraction", "0.25")):
        assert run.optimizer.lr_warmup_steps == 6
        assert _lr_curve(run, 6) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_warmup_samples_follow_the_hand_computed_curve():
    """--lr-warmup-samples 6 --lr-decay-samples 10, cosine: warm-up, then cosine to --min-lr,
    then --min-lr held."""
    import math

    run = _run("--train-samples", "16", "--lr-warmup-samples", "6", "--lr-decay-samples", "10",
               "--lr-decay-style", "cosine", "--min-lr", "1e-4")
    cosine = 1e-4 + 0.5 * (LR - 1e-4) * (math.cos(math.pi * (8 - 6) / (10 - 6)) + 1)
    assert _lr_curve(run, 4) == pytest.approx([LR * 4 / 6, cosine, 1e-4, 1e-4], rel=1e-12)


@pytest.mark.parametrize("extra, needle", [
    ([], "give --train-iters or --train-samples"),
    (["--train-iters", "3", "--train-samples", "12"],
     "give only one of --train-iters 3 and --train-samples 12"),
    (["--train-samples", "12", "--lr-decay-iters", "2"],
     "--lr-decay-iters does not go with sample-based (--train-samples) training"),
    (["--train-samples", "12", "--lr-warmup-iters", "1"],
     "--lr-warmup-iters does not go with sample-based"),
    (["--train-iters", "3", "--lr-decay-samples", "8"],
     "--lr-decay-samples does not go with iteration-based (--train-iters) training"),
    (["--train-iters", "3", "--lr-warmup-samples", "8"], "--lr-warmup-samples does not go"),
    (["--train-samples", "12", "--lr-warmup-samples", "4", "--lr-warmup-fraction", "0.1"],
     "give only one of --lr-warmup-fraction and --lr-warmup-iters/--lr-warmup-samples"),
    (["--train-iters", "3", "--lr-warmup-iters", "1", "--lr-warmup-fraction", "0.1"],
     "give only one of --lr-warmup-fraction"),
    (["--train-samples", "3"], "--train-samples 3 is less than one global batch "
                               "(--global-batch-size 4)"),
    (["--train-samples", "12", "--lr-warmup-samples", "12"],
     "--lr-warmup-samples 12 must be smaller than the decay length 12 (--lr-decay-samples"),
    (["--train-samples", "12", "--lr-warmup-fraction", "1"],
     "--lr-warmup-fraction must be a finite number in [0, 1) (got 1.0)"),
    (["--train-samples", "0"], "--train-samples must be >= 1 (got 0)"),
    (["--train-samples", "12", "--lr-decay-samples", "0"], "--lr-decay-samples must be >= 1"),
    # Megatron-LM's warm-up start, WSD and weight-decay ramp flags (schedule_arguments.py)
    (["--train-iters", "8", "--lr-warmup-init", "0.01"],
     "--lr-warmup-init 0.01 exceeds --lr 0.001"),
    (["--train-iters", "8", "--lr-decay-style", "WSD"],
     "--lr-decay-style WSD needs --lr-wsd-decay-iters"),
    (["--train-samples", "32", "--lr-decay-style", "WSD"],
     "--lr-decay-style WSD needs --lr-wsd-decay-samples"),
    (["--train-iters", "8", "--lr-wsd-decay-iters", "3"],
     "--lr-wsd-decay-iters 3 needs --lr-decay-style WSD (it is linear)"),
    (["--train-samples", "32", "--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "3"],
     "--lr-wsd-decay-iters does not go with sample-based training"),
    (["--train-iters", "8", "--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "9"],
     "--lr-wsd-decay-iters 9 exceeds the decay length 8"),
    (["--train-iters", "8", "--start-weight-decay", "0.1"],
     "--start-weight-decay 0.1 needs --weight-decay-incr-style linear or cosine"),
    (["--train-iters", "8", "--weight-decay-incr-style", "linear", "--start-weight-decay", "0"],
     "--weight-decay-incr-style linear needs --end-weight-decay"),
    # Megatron-LM's batch-size ramp-up rules (schedule_arguments.py, batch_rampup.py);
    # TINY_GPT_ARGS: --micro-batch-size 2 on one rank, --global-batch-size 4.
    (["--train-iters", "8", "--rampup-batch-size", "2", "2", "100"],
     "--rampup-batch-size 2 2 100 needs sample-based training: give --train-samples instead "
     "of --train-iters 8"),
    (["--train-samples", "64", "--rampup-batch-size", "4", "2", "16"],
     "--rampup-batch-size 4 2 16: START 4 must be less than --global-batch-size 4"),
    (["--train-samples", "64", "--rampup-batch-size", "1", "2", "16"],
     "--rampup-batch-size 1 2 16: --global-batch-size 4 - START 1 = 3 is not divisible by "
     "INCREMENT 2"),
    (["--train-samples", "64", "--rampup-batch-size", "1", "3", "16"],
     "--rampup-batch-size 1 3 16: the ramp-up's global batch size 1 is not divisible by "
     "--micro-batch-size 2 x data-parallel size 1 = 2"),
    (["--train-samples", "64", "--rampup-batch-size", "1", "3", "16",
      "--decrease-batch-size-if-needed"],
     "--rampup-batch-size 1 3 16: START 1 rounds down to no samples with "
     "--decrease-batch-size-if-needed"),
    (["--train-samples", "64", "--decrease-batch-size-if-needed"],
     "--decrease-batch-size-if-needed needs --rampup-batch-size"),
    (["--train-samples", "64", "--rampup-batch-size", "2", "0", "16"],
     "--rampup-batch-size must be >= 1"),
    (["--train-samples", "64", "--rampup-batch-size", "2", "2", "20000002"],
     "--rampup-batch-size 2 2 20000002: up to 10000001 ramp-up steps of at least 2 samples, "
     "more than 10000000"),
    (["--train-iters", "8", "--weight-decay-incr-style", "cosine", "--start-weight-decay",
      "0.2", "--end-weight-decay", "0.1"], "--start-weight-decay 0.2 exceeds --end-weight-decay"),
])
def test_bad_schedule_flags_are_one_line(extra, needle):
    with pytest.raises(ArgumentValidationError) as err:
        _run(*extra)
    assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)
