"""--rampup-batch-size's batch of every iteration (batch_rampup.py) against megatron-core's own
``RampupBatchsizeNumMicroBatchesCalculator`` driven as Megatron-LM's loop drives it (the batch
size from the samples consumed so far), and its log lines against the calculator's; the
iteration count of a --train-samples run against a hand count; what the flags resolve to
(Megatron-LM's GPT-3 175B recipe included); the checkpoint's record of the ramp-up; the
facade's refusal. The training runs are in test_batch_rampup_training.py; the one-line flag
errors in test_schedule_arguments.py.
"""

import itertools
import json
import logging

import pytest
from megatron.core import num_microbatches_calculator as core_calculator
from megatron.core.num_microbatches_calculator import RampupBatchsizeNumMicroBatchesCalculator

from megatron.varlen_training.arguments import ArgumentValidationError, parse_args
from megatron.varlen_training.batch_rampup import GlobalBatchSchedule, Rampup, RampupMessages
from megatron.varlen_training.config.from_flags import run_config
from megatron.varlen_training.errors import CheckpointError
from megatron.varlen_training.resume.consistency import check_run_args
from megatron.varlen_training.resume.run_args_record import save_run_args
from tests.harness.training_runs import TINY_GPT_ARGS, tiny_packed_config

# (global batch, micro batch, DP, decrease if needed, START, INCREMENT, SAMPLES)
SETTINGS = [
    (64, 2, 4, False, 16, 16, 200),
    (48, 4, 1, True, 6, 6, 100),  # 6, 12, 18, ... rounded down to multiples of 4
    (32, 1, 2, False, 2, 2, 7),  # more increments than ramp-up samples: sizes are skipped
    (1536, 1, 16, False, 16, 16, 5_859_375),  # Megatron-LM's GPT-3 175B recipe, DP 16
]


def _core_sizes(settings, num_steps: int) -> list[int]:
    """The running global batch size of each step from megatron-core's calculator, updated
    with the samples consumed before the step (Megatron-LM's train loop)."""
    gbs, mbs, dp, decrease, start, increment, samples = settings
    calculator = RampupBatchsizeNumMicroBatchesCalculator(
        gbs, mbs, dp, decrease, 0, start, increment, samples)
    sizes, consumed = [], 0
    for _ in range(num_steps):
        calculator.update(consumed, consistency_check=True)
        sizes.append(calculator.get_current_running_global_batch_size())
        consumed += sizes[-1]
    return sizes


def _schedule(settings) -> GlobalBatchSchedule:
    gbs, mbs, dp, decrease, start, increment, samples = settings
    return GlobalBatchSchedule(gbs, mbs * dp, Rampup(start, increment, samples), decrease)


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "-".join(map(str, s)))
def test_batch_sizes_equal_megatron_core_calculator(settings):
    schedule = _schedule(settings)
    ramp_steps = schedule.iterations_within(settings[-1]) + 1
    num_steps = ramp_steps + 5  # past the ramp-up: whole --global-batch-size batches
    want = _core_sizes(settings, num_steps)
    assert [schedule.size(i) for i in range(num_steps)] == want
    assert want[0] < want[-1] == settings[0]  # the batch did grow to --global-batch-size
    starts = [0, *itertools.accumulate(want)]  # batches follow each other
    assert [schedule.first_sample(i) for i in range(num_steps + 1)] == starts
    assert [schedule.indices(i) for i in range(num_steps)] == [
        range(starts[i], starts[i + 1]) for i in range(num_steps)]
    assert [schedule.iterations_within(s) for s in starts] == list(range(num_steps + 1))
    assert schedule.iterations_within(starts[2] - 1) == 1  # batch 2 is not whole yet


def test_train_iters_count_the_ramp_up_as_megatron_lm():
    """64 = --global-batch-size, ramp 16 16 200 (increments of 200 / 3 samples): steps start
    at 0, 16, 32, 48, 64 (16 each), 80, 112 (32 each), 144, 192 (48 each), then 240 > 200 ends
    the ramp-up after 9 steps; the 260 samples left of 500 are 4 whole batches of 64."""
    schedule = _schedule((64, 2, 4, False, 16, 16, 200))
    assert schedule.train_iters(500) == 13
    assert schedule.first_sample(13) == 240 + 4 * 64
    # --train-samples inside the ramp-up: steps start while consumed <= --train-samples (the
    # last one, at 48, ends past 50: Megatron-LM's count).
    assert schedule.train_iters(50) == 4
    assert schedule.first_sample(4) == 64


def test_without_rampup_every_batch_is_the_global_batch():
    schedule = GlobalBatchSchedule(8, 2)
    assert [schedule.indices(i) for i in range(3)] == [range(0, 8), range(8, 16), range(16, 24)]
    assert schedule.train_iters(43) == 5 and schedule.iterations_within(43) == 5


def _run(*extra):
    return run_config(parse_args(TINY_GPT_ARGS + list(extra), world_size=1))


def test_flags_resolve_the_run():
    """The same run through the flags: --train-iters from the ramp-up's count, the datasets
    sized to what the loop reads, the ramp-up in the typed config."""
    run = _run("--train-samples", "500", "--global-batch-size", "64", "--rampup-batch-size",
               "16", "16", "200")
    assert run.training.train_iters == 13
    assert run.training.rampup_batch_size == (16, 16, 200)
    assert run.data.train_samples == 500
    assert GlobalBatchSchedule.of(run.training) == _schedule((64, 2, 1, False, 16, 16, 200))
    # the last ramp-up step ends past --train-samples: the datasets hold what it reads
    short = _run("--train-samples", "50", "--global-batch-size", "64", "--rampup-batch-size",
                 "16", "16", "200")
    assert (short.training.train_iters, short.data.train_samples) == (4, 64)


@pytest.mark.parametrize("dp, decrease", [(1, False), (2, False), (4, True)])
def test_the_flag_layer_and_the_config_build_one_schedule(dp, decrease):
    """The validated flags (before any config) and the run's TrainingConfig give the schedule
    written from the flags by hand: --micro-batch-size 2 x DP, the ramp-up's triple."""
    extra = ["--decrease-batch-size-if-needed"] if decrease else []
    args = parse_args(TINY_GPT_ARGS + ["--train-samples", "500", "--global-batch-size", "64",
                                       "--rampup-batch-size", "16", "16", "200", *extra],
                      world_size=dp)
    by_hand = _schedule((64, 2, dp, decrease, 16, 16, 200))
    assert GlobalBatchSchedule.of(args) == GlobalBatchSchedule.of(run_config(args).training) \
        == by_hand


RAMPED = ("--train-samples", "500", "--global-batch-size", "64", "--rampup-batch-size", "16",
          "16", "200")


def test_resume_must_keep_the_rampup(tmp_path):
    """The ramp-up decides which samples each iteration reads: a checkpoint records it (and
    the position its iteration reached), and a resume with another ramp-up, or none, is refused
    in one line."""
    run = _run(*RAMPED)
    save_run_args(str(tmp_path), run, iteration=9)
    assert json.loads((tmp_path / "run_args.json").read_text())["consumed_train_samples"] == 240
    assert check_run_args(str(tmp_path), run) is None
    for other, shown in [(RAMPED[:-1] + ("100",), "[16, 16, 100]"), (RAMPED[:4], "None")]:
        with pytest.raises(CheckpointError) as err:
            check_run_args(str(tmp_path), _run(*other))
        assert str(err.value).startswith(
            f"--load: the checkpoint was trained with --rampup-batch-size [16, 16, 200], this "
            f"run has {shown}: that would change the data order"), str(err.value)


@pytest.mark.parametrize("key, value", [("rampup_batch_size", [2, 2, 8]),
                                        ("rampup_batch_size", 0),
                                        ("decrease_batch_size_if_needed", True)])
def test_facade_refuses_the_rampup_in_one_line(key, value):
    """MegatronWrap's caller hands each step its batch: there is no batch for it to grow."""
    from megatron.wrap import runtime
    from megatron.wrap.config import ConfigError, build_config

    config = tiny_packed_config(global_batch_size=4, train_iters=3)
    config["training"][key] = value
    with pytest.raises(ConfigError) as err:
        runtime.run_config_of(build_config(config), world_size=1)
    assert str(err.value).startswith(f"config key {key!r} ({value!r}) sizes pretrain_gpt.py's "
                                     f"global batches and has no effect in megatron.wrap")
    assert "\n" not in str(err.value)


GPT3_RAMPUP = ["--micro-batch-size", "1", "--global-batch-size", "1536",
               "--rampup-batch-size", "16", "16", "5859375"]  # Megatron-LM core_v0.16.1's


def test_gpt3_175b_recipe_rampup():
    """examples/gpt3/train_gpt3_175b_distributed.sh (core_v0.16.1) pairs its ramp-up with
    --train-iters 500000, which Megatron-LM's own validation refuses: so is it here, in one
    line naming the fix; with --train-samples the ramp-up runs, counted as Megatron-LM counts
    it (megatron-core's calculator walks the reference)."""
    with pytest.raises(ArgumentValidationError) as err:
        _run(*GPT3_RAMPUP, "--train-iters", "500000")
    assert str(err.value).startswith("--rampup-batch-size 16 16 5859375 needs sample-based "
                                     "training: give --train-samples instead of --train-iters "
                                     "500000"), str(err.value)
    train_samples = 10_000_000
    run = _run(*GPT3_RAMPUP, "--train-samples", str(train_samples))
    calculator = RampupBatchsizeNumMicroBatchesCalculator(1536, 1, 1, False, 0, 16, 16,
                                                          5_859_375)
    iterations = consumed = 0
    while consumed <= 5_859_375:  # the ramp-up's steps (all within --train-samples)
        calculator.update(consumed, consistency_check=True)
        consumed += calculator.get_current_global_batch_size()
        iterations += 1
    assert run.training.train_iters == iterations + (train_samples - consumed) // 1536



@pytest.mark.parametrize("settings", SETTINGS[:3], ids=lambda s: "-".join(map(str, s)))
def test_console_lines_are_megatron_cores(settings, caplog):
    """The lines the loop prints before each step equal what megatron-core's calculator logs
    (rank 0, verbose) when Megatron-LM's loop updates it with the consumed samples."""
    gbs, mbs, dp, decrease, *ramp = settings
    schedule, messages = _schedule(settings), RampupMessages(_schedule(settings), mbs)
    starts = [schedule.first_sample(i) for i in range(schedule.iterations_within(ramp[2]) + 3)]
    caplog.set_level(logging.INFO, logger=core_calculator.__name__)
    try:
        core_calculator.init_num_microbatches_calculator(0, ramp, gbs, mbs, dp, decrease)
        for consumed in starts:
            core_calculator.update_num_microbatches(consumed, consistency_check=True,
                                                    verbose=True)
    finally:
        core_calculator.destroy_num_microbatches_calculator()
    want = [r.getMessage() for r in caplog.records if r.name == core_calculator.__name__]
    assert len(want) > 3
    assert [line for consumed in starts for line in messages.at(consumed)] == want
