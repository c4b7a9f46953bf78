"""The iteration line every --log-interval iterations reports the interval, as Megatron-LM's.

Megatron-LM's ``training_log`` prints, every ``log_interval`` iterations, the mean lm loss of
the iterations since its last line, the elapsed time per iteration averaged over them, and the
throughput per GPU from that averaged time. With variable-length batches the interval's
throughput is its FLOPs over its time (per GPU); both are computed here from the raw numbers
handed in (FLOPs, seconds, tokens, world size), not from the formatter's fields; Megatron-LM
prints the throughput (with --log-throughput) to one decimal. The JSONL record stays one per
iteration.
"""

import re

import pytest

from megatron.varlen_training import metric_writers
from megatron.varlen_training.iteration_metrics import IterationMetrics, to_json_record

WORLD = 8
# (FLOPs, seconds, real tokens, lm loss, load-balancing loss) of six iterations
STEPS = [(4.0e15, 2.0, 1000, 4.0, 0.5), (1.0e15, 0.5, 300, 3.0, 0.25),
         (9.0e15, 3.0, 2500, 2.0, 0.75), (2.0e15, 1.0, 600, 1.5, 0.5),
         (2.0e15, 1.0, 600, 1.0, 0.5), (8.0e15, 2.0, 2000, 0.5, 0.25)]
INTERVAL = 3
NUMBER = r"([-+\d.E]+)"


def _record(iteration: int, flops, seconds, tokens, loss, balancing) -> dict:
    metrics = IterationMetrics(
        iteration=iteration, train_iters=len(STEPS), consumed_samples=8 * iteration,
        step_time_s=seconds, learning_rate=1e-3, global_batch_size=8, lm_loss=loss,
        grad_norm=1.0, num_microbatches=2, tokens=tokens, seqlen_sum=tokens,
        seqlen_squared_sum=tokens * 10, flops=int(flops), world_size=WORLD,
        losses={"load_balancing_loss": balancing})
    return to_json_record(metrics)


def _field(line: str, name: str) -> float:
    return float(re.search(re.escape(name) + r": +" + NUMBER + r" \|", line).group(1))


def test_line_reports_the_interval(monkeypatch):
    lines = []
    monkeypatch.setattr(metric_writers, "info_all_ranks", lines.append)
    writer = metric_writers.ConsoleMetricWriter(len(STEPS), INTERVAL, log_throughput=True)
    for iteration, step in enumerate(STEPS, start=1):
        writer.write(iteration, _record(iteration, *step))
    # Megatron-LM also prints after the first iteration (its own values; no new interval)
    assert len(lines) == 1 + len(STEPS) // INTERVAL
    assert _field(lines[0], "lm loss") == pytest.approx(STEPS[0][3], rel=1e-6)
    for line, start in zip(lines[1:], range(0, len(STEPS), INTERVAL)):
        interval = STEPS[start:start + INTERVAL]
        flops, seconds, tokens, losses, balancing = (
            [step[i] for step in interval] for i in range(5))
        assert _field(line, "lm loss") == pytest.approx(sum(losses) / INTERVAL, rel=1e-6)
        assert _field(line, "load_balancing_loss") == pytest.approx(
            sum(balancing) / INTERVAL, rel=1e-6)
        assert _field(line, "elapsed time per iteration (ms)") == pytest.approx(
            1000 * sum(seconds) / INTERVAL, abs=0.05 + 1e-9)
        assert _field(line, "throughput per GPU (TFLOP/s/GPU)") == pytest.approx(
            sum(flops) / (sum(seconds) * WORLD * 1e12), abs=0.05 + 1e-9)
        assert _field(line, "tokens per second") == pytest.approx(
            sum(tokens) / sum(seconds), abs=0.05 + 1e-9)
        # the rest is the last iteration's
        assert _field(line, "consumed samples") == 8 * (start + INTERVAL)


def test_interval_of_one_is_each_iteration(monkeypatch):
    lines = []
    monkeypatch.setattr(metric_writers, "info_all_ranks", lines.append)
    writer = metric_writers.ConsoleMetricWriter(len(STEPS), 1, log_throughput=True)
    for iteration, (flops, seconds, tokens, loss, balancing) in enumerate(STEPS, start=1):
        writer.write(iteration, _record(iteration, flops, seconds, tokens, loss, balancing))
        assert _field(lines[-1], "lm loss") == pytest.approx(loss, rel=1e-6)
        assert _field(lines[-1], "throughput per GPU (TFLOP/s/GPU)") == pytest.approx(
            flops / (seconds * WORLD * 1e12), abs=0.05 + 1e-9)
