"""The console iteration line over ``--log-interval`` (log_interval.py, ConsoleMetricWriter),
against Megatron-LM's ``training_log`` read as facts: which iterations print, what is averaged
over the interval (the losses over applied iterations, the time over all of them), what is the
current iteration's, and the counts of skipped and NaN iterations. Expected values are counted
and averaged here, by hand, from the records the writer is given."""

import math
import re
import statistics

import pytest

from tests.harness.log_state import clean_log_state, use_rank  # noqa: F401 (a fixture)
from tests.harness.megatron_lm_line import parse_iteration_line
from megatron.varlen_training.iteration_metrics import IterationMetrics, to_json_record
from megatron.varlen_training.metric_writers import ConsoleMetricWriter

pytestmark = pytest.mark.usefixtures("clean_log_state")

TRAIN_ITERS = 300
GBS = 4
WORLD = 2
FLOAT = r"\d\.\d{6}E[+-]\d{2}"


def _fields(message: str) -> dict:
    """The values the checks read, parsed with Megatron-LM's format strings
    (tests/harness/megatron_lm_line.py; its --log-throughput field asked for); a loss Megatron-LM
    does not print (an average of 0) is None, as the grad norm of a skipped step."""
    line = parse_iteration_line(message)
    assert line.train_iters == TRAIN_ITERS and line.number("global batch size") == GBS
    return {"iteration": line.iteration, "consumed": line.fields["consumed samples"],
            "loss": line.losses.get("lm loss"), "lr": line.fields["learning rate"],
            "ms": line.fields["elapsed time per iteration (ms)"],
            "tflops": line.fields["throughput per GPU (TFLOP/s/GPU)"],
            "tokens_per_s": line.extras["tokens per second"],
            "scale": line.fields["loss scale"], "grad_norm": line.fields.get("grad norm"),
            "skipped": line.fields["number of skipped iterations"],
            "nan": line.fields["number of nan iterations"]}


def _metrics(iteration: int, skipped: bool = False, loss: float | None = None) -> IterationMetrics:
    """Iteration ``iteration``'s metrics: a distinct loss, step time, token count and LR each."""
    return IterationMetrics(
        iteration=iteration, train_iters=TRAIN_ITERS, consumed_samples=GBS * iteration,
        step_time_s=0.01 * (1 + iteration % 7), learning_rate=1e-4 * iteration,
        global_batch_size=GBS, lm_loss=3.0 + 0.1 * iteration if loss is None else loss,
        grad_norm=None if skipped else 0.5 + 0.01 * iteration, num_microbatches=2,
        tokens=100 + 3 * iteration, seqlen_sum=100 + 3 * iteration, seqlen_squared_sum=5000,
        flops=(7 + iteration) * 10**12, world_size=WORLD,
        loss_scale=2.0 ** (20 - iteration % 3), skipped=skipped)


def _writer(interval: int) -> ConsoleMetricWriter:
    return ConsoleMetricWriter(TRAIN_ITERS, interval=interval, log_throughput=True)


def _lines(capsys, writer: ConsoleMetricWriter, metrics: list[IterationMetrics]) -> list:
    for m in metrics:
        writer.write(m.iteration, to_json_record(m))
    out = capsys.readouterr().out.splitlines()
    return [_fields(line.split(" INFO ", 1)[1]) for line in out]


def _expected(interval: list[IterationMetrics]) -> dict:
    """Megatron-LM's values for a line ending ``interval``, computed here by hand."""
    applied = [m for m in interval if not m.skipped]
    last = interval[-1]
    seconds = math.fsum(m.step_time_s for m in interval)
    return {
        "iteration": last.iteration, "consumed": last.consumed_samples,
        "loss": statistics.fmean(m.lm_loss for m in applied) if applied else 0.0,
        "ms": 1000.0 * seconds / len(interval),
        "tflops": math.fsum(m.flops for m in interval) / (seconds * WORLD * 1e12),
        "tokens_per_s": sum(m.tokens for m in interval) / seconds,
        "lr": last.learning_rate, "scale": last.loss_scale, "grad_norm": last.grad_norm,
        "skipped": len(interval) - len(applied),
        "nan": sum(m.skipped and not math.isfinite(m.lm_loss) for m in interval),
    }


def _check(line, expected: dict) -> None:
    assert int(line["iteration"]) == expected["iteration"]
    assert int(line["consumed"]) == expected["consumed"]
    if expected["loss"] == 0.0:  # Megatron-LM prints no loss whose average is not above 0
        assert line["loss"] is None
    else:
        assert float(line["loss"]) == pytest.approx(expected["loss"], rel=1e-6)
    assert float(line["lr"]) == pytest.approx(expected["lr"], rel=1e-6)
    assert float(line["ms"]) == pytest.approx(expected["ms"], abs=0.05)
    assert float(line["tflops"]) == pytest.approx(expected["tflops"], abs=0.05 + 1e-9)  # .1f
    assert float(line["tokens_per_s"]) == pytest.approx(expected["tokens_per_s"], abs=0.05)
    assert float(line["scale"]) == expected["scale"]
    if expected["grad_norm"] is None:
        assert line["grad_norm"] is None  # a skipped step has no grad norm: left out
    else:
        assert float(line["grad_norm"]) == pytest.approx(expected["grad_norm"], abs=5e-4)
    assert (int(line["skipped"]), int(line["nan"])) == (expected["skipped"], expected["nan"])


def test_lines_average_the_interval_as_megatron_lm(capsys):
    """--log-interval 4 over 10 iterations, 6 and 7 skipped by the fp16 scaler (7 with an Inf
    loss): lines after iteration 1 (the first), 4 and 8; the line at 4 covers 1-4 (the first
    line starts no interval), the one at 8 covers 5-8 with 2 applied iterations in its loss."""
    use_rank(0)
    metrics = [_metrics(i, skipped=i in (6, 7), loss=math.inf if i == 7 else None)
               for i in range(1, 11)]
    lines = _lines(capsys, _writer(4), metrics)
    assert [int(line["iteration"]) for line in lines] == [1, 4, 8]
    for line, interval in zip(lines, (metrics[:1], metrics[:4], metrics[4:8])):
        _check(line, _expected(interval))


def test_a_resumed_run_prints_its_first_iteration_and_then_each_interval(capsys):
    """A run resumed at iteration 97 with --log-interval 50: its first iteration (98) prints,
    the line at 100 covers 98-100, the one at 150 covers 101-150."""
    use_rank(0)
    metrics = [_metrics(i) for i in range(98, 151)]
    lines = _lines(capsys, _writer(50), metrics)
    assert [int(line["iteration"]) for line in lines] == [98, 100, 150]
    for line, interval in zip(lines, (metrics[:1], metrics[:3], metrics[3:])):
        _check(line, _expected(interval))


def test_a_first_iteration_on_a_multiple_is_counted_in_one_line_only(capsys):
    """--log-interval 1 (the facade's console writer): every line is its own iteration's, the
    first included (Megatron-LM would count its first iteration again in its second line)."""
    use_rank(0)
    metrics = [_metrics(i, skipped=i == 2) for i in range(1, 4)]
    lines = _lines(capsys, _writer(1), metrics)
    for line, m in zip(lines, metrics):
        _check(line, _expected([m]))


def test_all_skipped_interval_reports_no_loss_and_counts_them(capsys):
    use_rank(0)
    metrics = [_metrics(i, skipped=True, loss=math.nan if i == 2 else None) for i in (1, 2)]
    (first, second) = _lines(capsys, _writer(2), metrics)
    assert second["loss"] is None  # Megatron-LM: 0 / 1 applied iterations, not printed
    assert (int(second["skipped"]), int(second["nan"])) == (2, 1)


# --- the loop's console line, end to end -------------------------------------------------------

def _overflowing_at(steps: set[int]):
    """training.optimizer_step as megatron-core's fp16 loss scaler runs it, its overflow verdict
    (``prepare_grads()`` found Inf/NaN in the scaled grads) forced at the given steps: --fp16
    is CUDA-only here, the skip path after the verdict is the real one."""
    from megatron.varlen_training import training

    real, calls = training.optimizer_step, [0]

    def optimizer_step(optimizer, check=None):
        calls[0] += 1
        if calls[0] not in steps:
            return real(optimizer, check)
        optimizer.prepare_grads = lambda: True  # found_inf: the update is skipped
        try:
            return real(optimizer, check)
        finally:
            del optimizer.prepare_grads
    return optimizer_step


def rank_console_and_records(argv: list[str], skipped: set[int] = frozenset()) -> dict:
    import contextlib
    import io
    import json

    from megatron.varlen_training import training
    from tests.harness.training_runs import train_on_this_rank

    out = io.StringIO()
    training.optimizer_step = _overflowing_at(set(skipped))  # this process only
    with contextlib.redirect_stdout(out):
        train_on_this_rank(argv)
    with open(argv[argv.index("--log-metrics-jsonl") + 1], encoding="utf-8") as handle:
        records = [json.loads(line) for line in handle]
    lines = [line.split(" INFO ", 1)[1] for line in out.getvalue().splitlines()
             if "] iteration " in line.split(" INFO ", 1)[-1]]
    return {"lines": lines, "records": records}


def test_pretrain_gpts_line_averages_its_per_iteration_records(tmp_path):
    """pretrain_gpt.py's loop, 5 iterations at --log-interval 2, the loss scaler skipping
    iteration 3: lines after iterations 1, 2 and 4, each loss the mean of the JSONL's
    per-iteration losses of the interval's APPLIED iterations (Megatron-LM's total_loss_dict
    adds no skipped step's loss), the skipped one counted, its grad norm absent."""
    from tests.harness.multirank import run_distributed
    from tests.harness.training_runs import TINY_GPT_ARGS

    argv = TINY_GPT_ARGS + ["--train-iters", "5", "--log-metrics-jsonl",
                            str(tmp_path / "metrics.jsonl")]
    argv[argv.index("--log-interval") + 1] = "2"  # TINY_GPT_ARGS logs every iteration
    (result,) = run_distributed(rank_console_and_records, 1, args=(argv, {3}), timeout_s=240)
    records = {record["iteration"]: record for record in result["records"]}
    assert [i for i, r in records.items() if r["skipped_iter"]] == [3]
    # A skipped step has no grad norm and, as in Megatron-LM, no scheduler step: its LR stays.
    assert records[3]["grad_norm"] is None and records[3]["lr"] == records[2]["lr"]
    lines = [parse_iteration_line(line) for line in result["lines"]]
    assert [line.iteration for line in lines] == [1, 2, 4], result["lines"]
    for line, applied, skipped in zip(lines, ([1], [1, 2], [4]), (0, 0, 1)):
        expected = statistics.fmean(records[i]["lm_loss"] for i in applied)
        assert line.losses["lm loss"] == pytest.approx(expected, rel=1e-6), (applied, line)
        assert line.number("number of skipped iterations") == skipped
        assert line.number("number of nan iterations") == 0
    assert len({records[i]["lm_loss"] for i in (1, 2, 3, 4)}) == 4  # a real average
