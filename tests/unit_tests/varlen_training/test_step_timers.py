"""Megatron-LM's timers: ``--timing-log-level``, ``--timing-log-option``,
``--log-timers-to-tensorboard``.

A PP2 run at level 2 with --log-interval 2 writes, read back from its TensorBoard event file,
Megatron-LM's timer scalars (``<timer>-time``, only names of Megatron-LM's lists) at iterations
2 and 4 only, among them the phases megatron-core and the loop time (forward-backward, the
micro-batches' compute, the pipeline's sends and receives, the gradient reduction, the
optimizer's phases, the batch generator). Reference for the interval arithmetic: the JSONL
records of the same run -- ``iteration-time`` is the mean of the interval's ``step_time_s``,
``throughput`` its FLOP-weighted TFLOP/s -- and ``forward-backward`` per iteration cannot
exceed the iteration time (a total not divided by the interval's iterations would). A timer
around a known sleep reads back at least the sleep, and megatron-core's printed block follows
``--timing-log-option``.
"""

import json
import time
from pathlib import Path

import pytest

from tests.harness.multirank import run_distributed
from tests.harness.training_runs import TINY_GPT_ARGS, train_on_this_rank

TIMER_NAMES_PP2 = {"forward-backward", "forward-compute", "backward-compute", "all-grads-sync",
                   "optimizer", "optimizer-clip-main-grad", "optimizer-inner-step",
                   "batch-generator"}
CONTAINED = 1.05  # clock reads around the barriers
TIMED_ARGS = TINY_GPT_ARGS + ["--train-iters", "4", "--log-interval", "2",
                              "--timing-log-level", "2", "--log-timers-to-tensorboard",
                              "--log-throughput", "--pipeline-model-parallel-size", "2"]


def _scalars(folder: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(folder))
    accumulator.Reload()
    return {tag: {event.step: event.value for event in accumulator.Scalars(tag)}
            for tag in accumulator.Tags()["scalars"]}


def _jsonl(path: Path) -> dict[int, dict]:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return {record["iteration"]: record for record in records}


def _interval_means(records: dict[int, dict], iterations: range) -> tuple[float, float]:
    seconds = sum(records[i]["step_time_s"] for i in iterations)
    tflop = sum(records[i]["tflops_per_device"] * records[i]["step_time_s"] for i in iterations)
    return seconds / len(iterations), tflop / seconds


def test_level_2_timers_in_tensorboard(tmp_path):
    from megatron.varlen_training.step_timers import LEVEL_1_TIMERS, LEVEL_2_TIMERS

    argv = TIMED_ARGS + ["--tensorboard-dir", str(tmp_path / "tb"),
                         "--log-metrics-jsonl", str(tmp_path / "metrics.jsonl")]
    run_distributed(train_on_this_rank, 2, args=(argv,), timeout_s=240)
    scalars, records = _scalars(tmp_path / "tb"), _jsonl(tmp_path / "metrics.jsonl")
    megatron_lm_names = {name + "-time" for name in LEVEL_1_TIMERS + LEVEL_2_TIMERS}
    timer_tags = {tag for tag in scalars if tag.endswith("-time")}
    assert timer_tags <= megatron_lm_names | {"iteration-time"}, timer_tags
    assert {name + "-time" for name in TIMER_NAMES_PP2} <= timer_tags, timer_tags
    assert any("send" in tag or "recv" in tag for tag in timer_tags)  # PP2's communication
    for tag in timer_tags | {"throughput"}:
        assert sorted(scalars[tag]) == [2, 4], tag  # --log-interval 2, not every iteration
    for end in (2, 4):
        iteration_time, throughput = _interval_means(records, range(end - 1, end + 1))
        assert scalars["iteration-time"][end] == pytest.approx(iteration_time, rel=1e-6)
        assert scalars["throughput"][end] == pytest.approx(throughput, rel=1e-6)
        for tag in timer_tags:
            assert 0.0 < scalars[tag][end] <= 1.5 * iteration_time, (tag, end)
        # Barriers start it and end its gradient reduction on every rank inside the last
        # rank's step: per iteration it is shorter than that step (a total over the interval,
        # not divided by its 2 iterations, would not be).
        assert scalars["forward-backward-time"][end] <= CONTAINED * iteration_time
    assert "forward-backward-time" in records[2] and "forward-backward-time" not in records[3]


def test_level_0_writes_iteration_time_only(tmp_path):
    argv = TINY_GPT_ARGS + ["--train-iters", "2", "--log-timers-to-tensorboard",
                            "--tensorboard-dir", str(tmp_path / "tb"),
                            "--log-metrics-jsonl", str(tmp_path / "metrics.jsonl")]
    run_distributed(train_on_this_rank, 1, args=(argv,), timeout_s=240)
    scalars, records = _scalars(tmp_path / "tb"), _jsonl(tmp_path / "metrics.jsonl")
    assert {tag for tag in scalars if tag.endswith("-time")} == {"iteration-time"}
    assert "throughput" not in scalars  # Megatron-LM's needs --log-throughput
    for iteration in (1, 2):
        assert scalars["iteration-time"][iteration] == pytest.approx(
            records[iteration]["step_time_s"], rel=1e-6)


SLEEP_S = 0.05


def _printed_blocks(option: str) -> dict:
    from megatron.varlen_training.config.logging import LoggingConfig
    from megatron.varlen_training.step_timers import LEVEL_1, OPTIMIZER, StepTimers

    logging = LoggingConfig(log_interval=1, log_metrics_jsonl=None, tensorboard_dir=None,
                            wandb_project=None, wandb_exp_name=None, wandb_save_dir=None,
                            timing_log_level=1, timing_log_option=option,
                            log_timers_to_tensorboard=True)
    lines = []
    timers = StepTimers(logging, is_last_rank=True, print_line=lines.append)
    with timers.timed(OPTIMIZER, LEVEL_1):
        time.sleep(SLEEP_S)
    values = timers.end_step(1, step_time_s=1.0, tflops_per_device=0.0)
    return {"lines": lines, "values": values}


@pytest.mark.parametrize("option, header", [
    ("minmax", "(min, max) time across ranks (ms):"), ("max", "max time across ranks (ms):"),
    ("all", "times across ranks (ms):"),
])
def test_timer_values_and_printed_block(option, header):
    (result,) = run_distributed(_printed_blocks, 1, args=(option,), timeout_s=60)
    assert result["values"]["iteration-time"] == 1.0
    assert SLEEP_S <= result["values"]["optimizer-time"] < 1.0
    (block,) = result["lines"]
    assert block.startswith(header) and "optimizer" in block


@pytest.mark.parametrize("extra, message", [
    (["--timing-log-level", "3"], "--timing-log-level"),
    (["--timing-log-option", "median"], "--timing-log-option"),
])
def test_bad_timing_values_are_one_line(extra, message):
    from megatron.varlen_training.arguments import ArgumentValidationError, parse_args

    with pytest.raises(ArgumentValidationError) as err:
        parse_args(TINY_GPT_ARGS + ["--train-iters", "2"] + extra, world_size=1)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_default_run_has_no_timers():
    from megatron.varlen_training.config.from_flags import parse_run_config
    from megatron.varlen_training.training import core_optimizer_config

    run = parse_run_config(TINY_GPT_ARGS + ["--train-iters", "2"], world_size=1)
    assert run.logging.timing_log_level == 0
    assert core_optimizer_config(run).timers is None


@pytest.mark.parametrize("extra, barrier", [([], True),
                                            (["--no-barrier-with-level-1-timing"], False)])
def test_level_1_barrier_flag_reaches_megatron_core(extra, barrier):
    from megatron.varlen_training.config.from_flags import parse_run_config
    from megatron.varlen_training.training import core_optimizer_config

    run = parse_run_config(TINY_GPT_ARGS + ["--train-iters", "2", "--timing-log-level", "1"]
                           + extra, world_size=1)
    assert run.logging.barrier_with_L1_time is barrier
    assert core_optimizer_config(run, timers=object()).barrier_with_L1_time is barrier
