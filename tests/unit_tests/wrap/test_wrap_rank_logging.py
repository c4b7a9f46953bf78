"""Rank-aware logging: prefixes, rank-0 filtering, capture/restore, progress, metric writers."""

import builtins
import json
import sys
import types
import warnings

import pytest

from megatron.wrap import rank_logging as wrap_logging
from megatron.wrap.rank_logging import (
    JsonlMetricWriter,
    ProgressBar,
    build_metric_writers,
    capture_print,
    capture_warnings,
    debug_rank_0,
    error_all_ranks,
    format_prefix,
    info_all_ranks,
    info_rank_0,
    set_coordinates_provider,
    set_log_level,
    warning_all_ranks,
    warning_rank_0,
)

RANK_3 = {"rank": 3, "tp": 1, "pp": 0, "dp": 1, "cp": 0}


@pytest.fixture(autouse=True)
def _reset_logging(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    set_log_level("INFO")
    yield
    set_coordinates_provider(None)
    set_log_level("INFO")


def use_rank(rank: int, **coordinates: int) -> None:
    set_coordinates_provider(lambda: {"rank": rank, **coordinates})


def test_prefix_format():
    assert format_prefix(RANK_3) == "[rank 3 | tp 1 pp 0 dp 1 cp 0]"
    assert format_prefix({"rank": 0}) == "[rank 0]"
    assert format_prefix({"cp": 2, "rank": 1, "tp": 0, "ep": 1}) == "[rank 1 | tp 0 cp 2 ep 1]"


def test_lines_carry_provider_coordinates(capsys):
    use_rank(**RANK_3)
    info_all_ranks("loaded %d samples", 12)
    assert capsys.readouterr().out == "[rank 3 | tp 1 pp 0 dp 1 cp 0] INFO loaded 12 samples\n"


def test_default_rank_comes_from_the_environment(capsys, monkeypatch):
    monkeypatch.setenv("RANK", "2")
    warning_all_ranks("careful")
    assert capsys.readouterr().out == "[rank 2] WARNING careful\n"


def test_every_line_of_a_message_is_prefixed(capsys):
    use_rank(1)
    error_all_ranks("first\nsecond")
    assert capsys.readouterr().out == "[rank 1] ERROR first\n[rank 1] ERROR second\n"


def test_rank_0_functions_are_silent_on_other_ranks(capsys):
    use_rank(1)
    info_rank_0("a")
    warning_rank_0("b")
    debug_rank_0("c")
    info_all_ranks("d")
    assert capsys.readouterr().out == "[rank 1] INFO d\n"
    use_rank(0)
    info_rank_0("a")
    warning_rank_0("b")
    assert capsys.readouterr().out == "[rank 0] INFO a\n[rank 0] WARNING b\n"


def test_debug_follows_the_log_level(capsys):
    debug_rank_0("hidden")
    set_log_level("DEBUG")
    debug_rank_0("shown")
    assert capsys.readouterr().out == "[rank 0] DEBUG shown\n"


def test_messages_with_percent_and_no_args_are_kept(capsys):
    info_all_ranks("100% done")
    assert capsys.readouterr().out == "[rank 0] INFO 100% done\n"


def test_capture_print_routes_and_restores(capsys):
    original = builtins.print
    use_rank(2, tp=0)
    with capture_print():
        print("loss", 1.5)
        print("to stderr", file=sys.stderr)
    assert builtins.print is original
    captured = capsys.readouterr()
    assert captured.out == "[rank 2 | tp 0] INFO loss 1.5\n"
    assert captured.err == "to stderr\n"


def test_capture_print_rank_0_only_and_restores_on_error(capsys):
    original = builtins.print
    use_rank(1)
    with pytest.raises(RuntimeError), capture_print(rank_0_only=True):
        print("dropped")
        raise RuntimeError
    assert builtins.print is original
    assert capsys.readouterr().out == ""


def test_capture_warnings_routes_and_restores(capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        original = warnings.showwarning
        with capture_warnings():
            warnings.warn("old flag", DeprecationWarning)
        assert warnings.showwarning is original
    out = capsys.readouterr().out
    assert out.startswith("[rank 0] WARNING DeprecationWarning: old flag (")
    assert "test_wrap_rank_logging.py:" in out


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


def test_console_writer_logs_on_the_calling_rank(capsys):
    use_rank(3)
    (writer,) = build_metric_writers(["console"])
    writer.write(5, {"loss": 4.0, "lr": 0.001})
    assert capsys.readouterr().out == "[rank 3] INFO iteration 5 | loss 4 | lr 0.001\n"


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
        build_metric_writers(kinds, **settings)


class _FakeRun:
    def __init__(self, **kwargs):
        self.init_kwargs, self.logged, self.finished = kwargs, [], False

    def log(self, metrics, step):
        self.logged.append((step, metrics))

    def finish(self):
        self.finished = True


@pytest.mark.parametrize("api_key, mode", [(None, "offline"), ("secret", "online")])
def test_wandb_writer_is_offline_without_api_key(monkeypatch, api_key, mode):
    runs = []
    fake_wandb = types.ModuleType("wandb")
    fake_wandb.init = lambda **kwargs: runs.append(_FakeRun(**kwargs)) or runs[-1]
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb)
    if api_key:
        monkeypatch.setenv("WANDB_API_KEY", api_key)
    (writer,) = build_metric_writers(["wandb"], wandb_project="proj", wandb_exp_name="run1")
    writer.write(3, {"loss": _Scalar()})
    writer.close()
    (run,) = runs
    assert run.init_kwargs["mode"] == mode and run.init_kwargs["project"] == "proj"
    assert run.logged == [(3, {"loss": 0.25})] and run.finished


def test_tensorboard_writer_uses_summary_writer(monkeypatch, tmp_path):
    calls = []

    class FakeSummaryWriter:
        def __init__(self, log_dir):
            calls.append(("init", log_dir))

        def add_scalar(self, name, value, step):
            calls.append((name, value, step))

        def close(self):
            calls.append(("close",))

    fake_module = types.ModuleType("torch.utils.tensorboard")
    fake_module.SummaryWriter = FakeSummaryWriter
    monkeypatch.setitem(sys.modules, "tensorboard", types.ModuleType("tensorboard"))
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", fake_module)
    (writer,) = build_metric_writers(["tensorboard"], tensorboard_dir=str(tmp_path))
    writer.write(7, {"loss": 1.0})
    writer.close()
    assert calls == [("init", str(tmp_path)), ("loss", 1.0, 7), ("close",)]


def test_logging_does_not_need_torch_distributed():
    # Default coordinates work whether or not torch is imported, without a process group.
    assert wrap_logging.get_coordinates()["rank"] == 0


def test_default_coordinates_come_from_megatron_parallel_state(monkeypatch, capsys):
    fake_state = types.ModuleType("megatron.core.parallel_state")
    fake_state.model_parallel_is_initialized = lambda: True
    fake_state.get_tensor_model_parallel_rank = lambda: 1
    fake_state.get_pipeline_model_parallel_rank = lambda: 0
    fake_state.get_data_parallel_rank = lambda: 1
    fake_state.get_context_parallel_rank = lambda: 0
    monkeypatch.setitem(sys.modules, "megatron.core.parallel_state", fake_state)
    monkeypatch.setenv("RANK", "3")
    info_all_ranks("hi")
    assert capsys.readouterr().out == "[rank 3 | tp 1 pp 0 dp 1 cp 0] INFO hi\n"
