"""Megatron-LM's logging flags (logging_arguments.py): honoured through the real TensorBoard and
wandb (offline) writers, read back from their files, or refused in one line.

The expected names and values are written here from Megatron-LM core_v0.16.1's ``training_log``
and ``LoggerConfig`` (read as facts): ``loss-scale`` / ``loss-scale vs samples`` unless
``--no-log-loss-scale-to-tensorboard`` (alias ``--disable-...``); ``world-size`` / ``world-size
vs samples`` with ``--log-world-size-to-tensorboard``; ``--tensorboard-queue-size`` is the
SummaryWriter's ``max_queue``; ``--wandb-entity`` the run's entity. Memory: on CPU the CUDA-only
flags are refused; on CUDA (faked here: no GPU) the scalars are ``torch.cuda.memory_stats``'
four keys and the line is ``report_memory``'s, printed on Megatron-LM's schedule.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.harness.training_runs import TINY_GPT_ARGS
from tests.harness.wandb_offline import offline_history, offline_run_entity
from megatron.varlen_training import device_memory, logging_arguments
from megatron.varlen_training.arguments import ArgumentValidationError, parse_args
from megatron.varlen_training.config.from_flags import run_config
from megatron.varlen_training.iteration_metrics import IterationMetrics, to_json_record
from megatron.varlen_training.metric_writers import build_metric_writers

REPO = Path(__file__).resolve().parents[3]
WORLD = 2  # TINY_GPT_ARGS' batch of 4 in micro-batches of 2: DP2
GBS = 4
LOSS_SCALE = 2.0 ** 12


def _record(iteration: int) -> dict:
    return to_json_record(IterationMetrics(
        iteration=iteration, train_iters=2, consumed_samples=GBS * iteration,
        step_time_s=0.5, learning_rate=1e-3, global_batch_size=GBS, lm_loss=4.0,
        grad_norm=0.5, num_microbatches=1, tokens=64, seqlen_sum=64, seqlen_squared_sum=2048,
        flops=10**9, world_size=WORLD, loss_scale=LOSS_SCALE))


def _scalars(log_dir: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [(event.step, event.value) for event in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}


def _write_two_iterations(monkeypatch, tmp_path, *flags):
    """Parses TINY_GPT_ARGS + ``flags`` with TensorBoard, wandb (offline) and JSONL writers,
    writes iterations 1 and 2; returns (TB scalars, wandb rows, JSONL records, writers)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    paths = {"tb": tmp_path / "tb", "wandb": tmp_path / "wandb", "jsonl": tmp_path / "m.jsonl"}
    argv = TINY_GPT_ARGS + ["--train-iters", "2", "--tensorboard-dir", str(paths["tb"]),
                            "--wandb-project", "p", "--wandb-save-dir", str(paths["wandb"]),
                            "--log-metrics-jsonl", str(paths["jsonl"]), *flags]
    run = run_config(parse_args(argv, world_size=WORLD))
    writers = build_metric_writers(run.logging, 2, {}, console=False, world_size=WORLD)
    queue_sizes = [w._writer._get_file_writer().event_writer._async_writer._byte_queue.maxsize
                   for w in writers if hasattr(w, "_writer")]
    for iteration in (1, 2):
        for writer in writers:
            writer.write(iteration, _record(iteration))
    for writer in writers:
        writer.close()
    jsonl = [json.loads(line) for line in paths["jsonl"].read_text().splitlines()]
    return (_scalars(paths["tb"]), offline_history(str(paths["wandb"])), jsonl, queue_sizes,
            str(paths["wandb"]))


def test_defaults_write_the_loss_scale_and_no_world_size(monkeypatch, tmp_path):
    tb, wandb_rows, _, queue_sizes, save_dir = _write_two_iterations(monkeypatch, tmp_path)
    assert tb["loss-scale"] == [(1, LOSS_SCALE), (2, LOSS_SCALE)]
    assert tb["loss-scale vs samples"] == [(GBS, LOSS_SCALE), (2 * GBS, LOSS_SCALE)]
    assert wandb_rows[1]["loss-scale"] == LOSS_SCALE
    assert "world-size" not in tb and "world-size" not in wandb_rows[1]
    assert queue_sizes == [1000]  # Megatron-LM's default --tensorboard-queue-size
    assert offline_run_entity(save_dir) == ""


@pytest.mark.parametrize("flag", ["--no-log-loss-scale-to-tensorboard",
                                  "--disable-log-loss-scale-to-tensorboard"])
def test_no_loss_scale_leaves_it_out_of_tensorboard_and_wandb(monkeypatch, tmp_path, flag):
    tb, wandb_rows, jsonl, _, _ = _write_two_iterations(monkeypatch, tmp_path, flag)
    for name in ("loss-scale", "loss-scale vs samples", "loss_scale"):
        assert name not in tb and name not in wandb_rows[1], name
    assert "lm loss" in tb and "grad-norm" in wandb_rows[1]  # the others still go
    assert [record["loss_scale"] for record in jsonl] == [LOSS_SCALE] * 2  # not TensorBoard


def test_world_size_queue_size_and_entity(monkeypatch, tmp_path):
    tb, wandb_rows, _, queue_sizes, save_dir = _write_two_iterations(
        monkeypatch, tmp_path, "--log-world-size-to-tensorboard", "--tensorboard-queue-size",
        "7", "--wandb-entity", "team")
    assert tb["world-size"] == [(1, WORLD), (2, WORLD)]
    assert tb["world-size vs samples"] == [(GBS, WORLD), (2 * GBS, WORLD)]
    assert [wandb_rows[step]["world-size"] for step in (1, 2)] == [WORLD, WORLD]
    assert queue_sizes == [7]
    assert offline_run_entity(save_dir) == "team"


REFUSED = ["--log-energy", "--log-max-attention-logit",
           "--moe-routing-trace-path=/tmp/t", "--moe-routing-trace-max-training-iters=3",
           "--moe-routing-trace-capture-logits", "--moe-routing-trace-capture-hidden-states",
           "--moe-routing-trace-dump-weights", "--otel-enabled", "--otel-service-name=s",
           "--otel-span-groups=default"]


@pytest.mark.parametrize("flag", REFUSED)
def test_refused_flags_are_one_line_naming_the_flag(flag):
    with pytest.raises(ArgumentValidationError) as error:
        parse_args(TINY_GPT_ARGS + ["--train-iters", "2", flag], world_size=WORLD)
    message = str(error.value)
    assert "\n" not in message and flag.split("=")[0] in message and "not supported" in message


CUDA_ONLY = [["--log-memory-to-tensorboard"], ["--log-memory-interval", "5"],
             ["--log-device-memory-used"]]


@pytest.mark.parametrize("flags", CUDA_ONLY)
def test_memory_flags_are_refused_without_cuda_and_accepted_with_it(monkeypatch, flags):
    argv = TINY_GPT_ARGS + ["--train-iters", "2", *flags]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ArgumentValidationError) as error:
        parse_args(argv, world_size=WORLD)
    assert flags[0] in str(error.value) and "needs a GPU" in str(error.value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    logging = run_config(parse_args(argv, world_size=WORLD)).logging
    dest = logging_arguments.CUDA_MEMORY_FLAGS[flags[0]]
    assert getattr(logging, dest) == (int(flags[1]) if len(flags) > 1 else True)


def test_wandb_entity_needs_a_project():
    with pytest.raises(ArgumentValidationError, match="--wandb-entity 'team' needs "
                                                      "--wandb-project"):
        parse_args(TINY_GPT_ARGS + ["--train-iters", "2", "--wandb-entity", "team"],
                   world_size=WORLD)


def test_entry_point_refuses_in_one_line_with_exit_code_2():
    result = subprocess.run(
        [sys.executable, str(REPO / "pretrain_gpt.py"), *TINY_GPT_ARGS, "--train-iters", "2",
         "--log-energy"], capture_output=True, text=True, timeout=120, cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--log-energy is not supported" in lines[0], result.stderr


# --- device memory (CUDA faked: the numbers are the fake allocator's) -------------------------

STATS = {"reserved_bytes.all.current": 8 << 20, "allocated_bytes.all.current": 3 << 20,
         "allocated_bytes.all.peak": 5 << 20, "allocation.all.current": 17}


def _fake_allocator(monkeypatch):
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda: dict(STATS, other=1))
    for name, megabytes in (("memory_allocated", 3), ("max_memory_allocated", 5),
                            ("memory_reserved", 8), ("max_memory_reserved", 9),
                            ("device_memory_used", 20)):
        monkeypatch.setattr(torch.cuda, name, lambda mb=megabytes: mb * 1024 * 1024)


def test_memory_scalars_are_megatron_lms_names_of_the_allocator_stats(monkeypatch):
    _fake_allocator(monkeypatch)
    assert device_memory.memory_scalars() == {
        "mem-reserved-bytes": 8 << 20, "mem-allocated-bytes": 3 << 20,
        "mem-max-allocated-bytes": 5 << 20, "mem-allocated-count": 17}


def test_memory_line_is_megatron_lms_report_memory(monkeypatch):
    _fake_allocator(monkeypatch)
    line = "[Rank 3] (after 2 iterations) memory (MB) | allocated: 3.00 | max allocated: " \
           "5.00 | reserved: 8.00 | max reserved: 9.00"
    assert device_memory.memory_line("(after 2 iterations)", 3, False) == line
    assert device_memory.memory_line("(after 2 iterations)", 3, True) == \
        line + " | total device memory used: 20.00"


def _megatron_lm_memory_iterations(log_interval, memory_interval, start, iterations):
    """Megatron-LM's training_log, written out: report_memory_flag starts True; on a printed
    line (the first iteration, or a multiple of --log-interval) the flag reports and turns off
    after a line past start + 1; --log-memory-interval reports on printed lines too."""
    flag, printed = True, []
    for iteration in range(start + 1, start + iterations + 1):
        if not (iteration == start + 1 or iteration % log_interval == 0):
            continue
        reported = False
        if flag:
            printed.append(iteration)
            reported = True
            if iteration > start + 1:
                flag = False
        if memory_interval is not None and iteration % memory_interval == 0 and not reported:
            printed.append(iteration)
    return printed


@pytest.mark.parametrize("log_interval,memory_interval,start",
                         [(1, None, 0), (3, None, 0), (1, 4, 0), (2, 3, 0), (5, 2, 7),
                          (1, 1, 10)])
def test_memory_lines_follow_megatron_lms_schedule(log_interval, memory_interval, start):
    reports = device_memory.MemoryReports(log_interval, memory_interval, start)
    ours = [it for it in range(start + 1, start + 31) if reports.due(it)]
    assert ours == _megatron_lm_memory_iterations(log_interval, memory_interval, start, 30)


def test_mtp_and_per_layer_losses_reach_tensorboard_and_wandb_by_name(monkeypatch, tmp_path):
    """Megatron-LM writes ``mtp_1 loss`` (MTPLossLoggingHelper) and ``moe/<loss>_layer_<i>``
    (track_moe_metrics) under those names; the values here are the record's."""
    from megatron.varlen_training.metric_writers import (
        TensorBoardMetricWriter, WandbMetricWriter,
    )

    monkeypatch.setenv("WANDB_MODE", "offline")
    record = dict(_record(1), **{"mtp_1 loss": 3.5, "moe/z_loss_layer_1": 0.25})
    writers = [TensorBoardMetricWriter(tmp_path / "tb"),
               WandbMetricWriter("p", save_dir=str(tmp_path / "wandb"))]
    for writer in writers:
        writer.write(1, record)
        writer.close()
    tb, wandb_rows = _scalars(tmp_path / "tb"), offline_history(str(tmp_path / "wandb"))
    for name, value in (("mtp_1 loss", 3.5), ("moe/z_loss_layer_1", 0.25)):
        assert tb[name] == [(1, value)] and wandb_rows[1][name] == value, name


def test_the_line_averages_mtp_losses_over_the_applied_iterations():
    """Megatron-LM's training_log divides each loss of its total_loss_dict (lm loss, the MoE
    and MTP losses) by the interval's advanced iterations; megatron-core's
    MTPLossLoggingHelper.track_mtp_metrics adds the MTP losses to it every iteration, a
    skipped one's too (training_log leaves out only a skipped step's lm loss)."""
    from megatron.varlen_training.log_interval import LogInterval

    interval = LogInterval()
    for iteration, mtp, skipped in ((1, 3.0, False), (2, 100.0, True), (3, 5.0, False)):
        interval.add(dict(_record(iteration), **{"mtp_1 loss": mtp, "skipped_iter": skipped}))
    assert interval.summary(dict(_record(3), **{"mtp_1 loss": 5.0}))["mtp_1 loss"] == \
        (3.0 + 100.0 + 5.0) / 2
