"""The facade's progress line and metric writers (megatron/wrap/metric_writers.py); the log
lines themselves are megatron/varlen_training/log.py's
(tests/unit_tests/varlen_training/test_log.py)."""

import json
import sys

import pytest

from tests.harness.log_state import clean_log_state, use_rank  # noqa: F401 (a fixture)
from tests.harness.megatron_lm_line import parse_iteration_line
from tests.harness.metric_fakes import fake_metric_modules
from megatron.varlen_training.iteration_metrics import IterationMetrics, to_json_record
from megatron.wrap.config import ConfigError, facade_defaults
from megatron.wrap.metric_writers import (
    JsonlMetricWriter,
    ProgressBar,
    build_metric_writers,
    facade_logging_config,
)



pytestmark = pytest.mark.usefixtures("clean_log_state")


def test_progress_bar_renders_and_prints_on_rank_0_only(capsys):
    bar = ProgressBar(total=10, width=10)
    assert bar.render(3, {"loss": 4.12345}) == "step 3/10 [===       ] loss 4.123"
    assert bar.render(12) == "step 12/10 [==========]"
    use_rank(1)
    bar.update(3, {"loss": 4.1})
    assert capsys.readouterr().out == ""
    use_rank(0)
    bar.update(10)
    assert capsys.readouterr().out == "[rank 0] INFO step 10/10 [==========]\n"


def test_progress_bar_rejects_empty_total():
    with pytest.raises(ValueError, match="total > 0"):
        ProgressBar(total=0)


class _Scalar:
    """Stands in for a 0-d tensor: has `.item()`."""

    def item(self) -> float:
        return 0.25


def test_jsonl_writer_appends_one_object_per_step(tmp_path):
    path = tmp_path / "logs" / "metrics.jsonl"
    writer = JsonlMetricWriter(path)
    writer.write(1, {"loss": 2.0, "grad_norm": _Scalar()})
    writer.close()
    writer = JsonlMetricWriter(path)
    writer.write(2, {"loss": 1.5})
    writer.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert records == [{"iteration": 1, "loss": 2.0, "grad_norm": 0.25},
                       {"iteration": 2, "loss": 1.5}]


def test_console_writer_prints_pretrain_gpts_iteration_line_on_the_calling_rank(capsys):
    use_rank(3)
    (writer,) = build_metric_writers(["console"], train_iters=10)
    measured = IterationMetrics(
        iteration=5, train_iters=10, consumed_samples=20, step_time_s=0.5, learning_rate=1e-3,
        global_batch_size=4, lm_loss=4.0, grad_norm=1.5, num_microbatches=2, tokens=100,
        seqlen_sum=100, seqlen_squared_sum=5000, flops=10**12, world_size=1,
        extra={"padding_ratio": 0.25})
    writer.write(5, to_json_record(measured, {"nll": _Scalar()}))  # a flow metric, a tensor
    out = capsys.readouterr().out
    prefix = "[rank 3] INFO "
    assert out.startswith(prefix) and out.count("\n") == 1, out
    # Megatron-LM's line (its format strings: tests/harness/megatron_lm_line.py; no throughput
    # without --log-throughput), then the fork's fields and the flow's metric.
    line = parse_iteration_line(out[len(prefix):-1])
    assert (line.iteration, line.train_iters) == (5, 10)
    assert {label: value.strip() for label, value in line.fields.items()} == {
        "consumed samples": "20", "elapsed time per iteration (ms)": "500.0",
        "learning rate": "1.000000E-03", "global batch size": "4", "loss scale": "1.0",
        "grad norm": "1.500", "number of skipped iterations": "0",
        "number of nan iterations": "0"}
    assert line.losses == {"lm loss": 4.0}
    assert line.extras == {"tokens per second": "200.0", "number of microbatches": "2",
                           "padding ratio": "0.2500", "nll": "0.2500"}


@pytest.mark.parametrize(
    "kinds, settings, error, message",
    [
        (["tensorbord"], {}, ValueError, "unknown metric writer 'tensorbord' in logging"),
        (["jsonl"], {}, ValueError, "needs logging.metrics_jsonl_path"),
        (["tensorboard"], {}, ValueError, "needs logging.tensorboard_dir"),
        (["wandb"], {}, ValueError, "needs logging.wandb_project"),
        (["tensorboard"], {"tensorboard_dir": "tb"}, ImportError,
         "'tensorboard' needs the 'tensorboard' package.*logging.metric_writers"),
        (["wandb"], {"wandb_project": "p"}, ImportError,
         "'wandb' needs the 'wandb' package.*logging.metric_writers"),
    ],
)
def test_writer_errors_name_the_config_key(monkeypatch, kinds, settings, error, message):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # None in sys.modules: not importable
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(error, match=message):
        build_metric_writers(kinds, train_iters=1, **settings)


@pytest.mark.parametrize("key, value, kind", [
    ("tensorboard_dir", "tb", "tensorboard"), ("metrics_jsonl_path", "m.jsonl", "jsonl"),
    ("wandb_project", "p", "wandb"), ("wandb_exp_name", "e", "wandb"),
    ("wandb_save_dir", "w", "wandb"), ("wandb_entity", "team", "wandb"),
    ("wandb_mode", "offline", "wandb")])
def test_a_writer_setting_without_its_writer_is_refused(key, value, kind):
    """pretrain_gpt.py's --tensorboard-dir alone turns TensorBoard on; the facade's
    logging.tensorboard_dir without 'tensorboard' in metric_writers used to write nothing."""
    facade = {**facade_defaults(), key: value}
    with pytest.raises(ConfigError) as error:
        facade_logging_config(facade)
    assert str(error.value) == (
        f"config key 'logging.{key}' ({value!r}) configures the '{kind}' metric writer, which "
        f"logging.metric_writers ['console'] does not name: add '{kind}' to "
        f"logging.metric_writers, or remove logging.{key}")
    if kind == "jsonl":  # named, it is taken (tensorboard and wandb need their packages)
        logging, _ = facade_logging_config({**facade, "metric_writers": ["console", kind]})
        assert logging.log_metrics_jsonl == value


@pytest.mark.parametrize("api_key, wandb_mode, mode", [
    (None, None, "offline"), ("secret", None, "online"), ("secret", "offline", "offline")])
def test_wandb_writer_is_offline_without_api_key(monkeypatch, api_key, wandb_mode, mode):
    runs = []
    for name, module in fake_metric_modules([], runs).items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    if api_key:
        monkeypatch.setenv("WANDB_API_KEY", api_key)
    if wandb_mode:  # wandb's own setting wins over the key
        monkeypatch.setenv("WANDB_MODE", wandb_mode)
    (writer,) = build_metric_writers(["wandb"], train_iters=1, wandb_project="proj",
                                     wandb_exp_name="run1")
    writer.write(3, {"loss": _Scalar(), "grad_norm": None})  # None (a skipped step): left out
    writer.close()
    (run,) = runs
    assert run.init_kwargs["mode"] == mode and run.init_kwargs["project"] == "proj"
    assert run.logged == [(3, {"loss": 0.25})] and run.finished


def test_tensorboard_writer_uses_summary_writer(monkeypatch, tmp_path):
    calls = []
    for name, module in fake_metric_modules(calls, []).items():
        monkeypatch.setitem(sys.modules, name, module)
    (writer,) = build_metric_writers(["tensorboard"], train_iters=1,
                                     tensorboard_dir=str(tmp_path))
    writer.write(7, {"iteration": 7, "loss": 1.0})  # the iteration is the step, not a scalar
    writer.close()
    assert calls == [("init", str(tmp_path)), ("loss", 1.0, 7), ("close",)]


def _run_logging(training: dict):
    from megatron.wrap.config import build_config
    from megatron.wrap.runtime import run_config_of
    from tests.unit_tests.wrap.test_wrap_runtime_batch_sizes import CONFIG

    config = build_config({**CONFIG, "training": {**CONFIG["training"], **training}})
    return run_config_of(config, world_size=1)[0].logging


def test_pretrain_gpts_logging_flags_in_a_facade_config():
    """--log-interval keeps Megatron-LM's meaning (the console line at its multiples; unset,
    the facade prints at every call); --log-metrics-jsonl, whose facade twin is another key,
    is refused instead of dropped."""
    assert _run_logging({"log_interval": 5}).log_interval == 5
    assert _run_logging({}).log_interval == 1
    with pytest.raises(ConfigError) as error:
        _run_logging({"log_metrics_jsonl": "m.jsonl"})
    assert str(error.value) == (
        "config key 'log_metrics_jsonl' ('m.jsonl') is pretrain_gpt.py's flag and has no "
        "effect in megatron.wrap, whose metric writers its logging section names: set "
        "logging.metrics_jsonl_path and add 'jsonl' to logging.metric_writers")
