"""The facade's metric writers (console, JSONL, TensorBoard, wandb) and its rank-0 progress line.

The log lines themselves, their rank prefix, levels and print/warning capture are the training
layer's (``megatron.varlen_training.log``): the facade logs exactly like ``pretrain_gpt.py``. The
console writer prints ``pretrain_gpt.py``'s iteration line from the shared JSONL record
(``megatron.varlen_training.iteration_metrics``). Nothing here imports torch.
"""

import importlib
import importlib.util
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

# One schema, one line for both entry points (no torch either).
from megatron.varlen_training.log import info_all_ranks, print_rank_0
from megatron.varlen_training.iteration_metrics import ITERATION_KEY, JsonlMetricWriter, format_log_line

WANDB_API_KEY_ENV_VAR = "WANDB_API_KEY"
PROGRESS_BAR_WIDTH = 20
METRIC_WRITERS_KEY = "logging.metric_writers"
"""The config key that lists metric writers, named in errors."""


# --- progress --------------------------------------------------------------------------------


class ProgressBar:
    """A plain-text progress line logged on rank 0: `step 3/10 [======      ] loss 4.12`.

    Args:
        total: Number of steps (> 0).
        width: Characters inside the brackets.
        label: The word before the counter.
    """

    def __init__(self, total: int, width: int = PROGRESS_BAR_WIDTH, label: str = "step"):
        if total <= 0 or width <= 0:
            raise ValueError(f"ProgressBar needs total > 0 and width > 0, got {total}, {width}")
        self.total = total
        self.width = width
        self.label = label

    def render(self, step: int, metrics: Mapping[str, float] | None = None) -> str:
        """Returns the progress line for `step` (clamped to 0..total) and optional metrics."""
        done = min(max(step, 0), self.total)
        filled = self.width * done // self.total
        bar = "=" * filled + " " * (self.width - filled)
        line = f"{self.label} {step}/{self.total} [{bar}]"
        items = (metrics or {}).items()
        values = " ".join(f"{name} {_format_metric(value)}" for name, value in items)
        return f"{line} {values}" if values else line

    def update(self, step: int, metrics: Mapping[str, float] | None = None) -> None:
        """Logs the progress line on rank 0 (other ranks do nothing)."""
        print_rank_0(self.render(step, metrics))


def _format_metric(value: Any) -> str:
    value = _to_python(value)
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _to_python(value: Any) -> Any:
    """Turns 0-d tensors and numpy scalars into Python numbers; other values pass through."""
    return value.item() if hasattr(value, "item") else value


# --- metric writers --------------------------------------------------------------------------


class MetricWriter(Protocol):
    """Receives one dict of scalar metrics per step; used on the last rank only."""

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        """Records `metrics` for `step`."""

    def close(self) -> None:
        """Flushes and releases the backend."""


class ConsoleMetricWriter:
    """Logs ``pretrain_gpt.py``'s iteration line (on the calling rank, the last one).

    Args:
        train_iters: The ``M`` of ``iteration N/ M``.
    """

    def __init__(self, train_iters: int):
        self.train_iters = train_iters

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        """``metrics``: a record of the shared JSONL schema (``metrics.to_json_record``)."""
        record = {ITERATION_KEY: step, **{k: _to_python(v) for k, v in metrics.items()}}
        info_all_ranks(format_log_line(record, self.train_iters))

    def close(self) -> None:
        pass


class TensorBoardMetricWriter:
    """Writes each metric as a scalar of a `torch.utils.tensorboard.SummaryWriter`."""

    def __init__(self, log_dir: str | Path):
        _require_package("tensorboard", "tensorboard")
        summary_writer_class = importlib.import_module("torch.utils.tensorboard").SummaryWriter
        self._writer = summary_writer_class(log_dir=str(log_dir))

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        for name, value in metrics.items():
            self._writer.add_scalar(name, _to_python(value), step)

    def close(self) -> None:
        self._writer.close()


class WandbMetricWriter:
    """Logs metrics to a wandb run; offline unless WANDB_API_KEY is set (mode "auto").

    Args:
        project: The wandb project.
        name: The run name.
        save_dir: Where wandb keeps its files.
        mode: "auto", "online", "offline" or "disabled".
        config: Stored with the run (e.g. `WrapConfig.flat`).
    """

    def __init__(self, project: str, name: str | None = None, save_dir: str | None = None,
                 mode: str = "auto", config: Mapping[str, Any] | None = None):
        _require_package("wandb", "wandb")
        if mode == "auto":
            mode = "online" if os.environ.get(WANDB_API_KEY_ENV_VAR) else "offline"
        wandb = importlib.import_module("wandb")
        self._run = wandb.init(project=project, name=name, dir=save_dir, mode=mode,
                               config=dict(config or {}))

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        self._run.log({k: _to_python(v) for k, v in metrics.items()}, step=step)

    def close(self) -> None:
        self._run.finish()


def build_metric_writers(
    kinds: Sequence[str],
    *,
    train_iters: int,
    tensorboard_dir: str | None = None,
    wandb_project: str | None = None,
    wandb_exp_name: str | None = None,
    wandb_save_dir: str | None = None,
    wandb_mode: str = "auto",
    jsonl_path: str | None = None,
    run_config: Mapping[str, Any] | None = None,
) -> list[MetricWriter]:
    """Builds the metric writers named in `logging.metric_writers` (call on the last rank).

    Args:
        kinds: Any of "console", "jsonl", "tensorboard", "wandb".
        train_iters: The run's length, shown by "console" (``iteration N/ M``).
        tensorboard_dir: Needed by "tensorboard" (config key `logging.tensorboard_dir`).
        wandb_project: Needed by "wandb" (config key `logging.wandb_project`).
        wandb_exp_name: The wandb run name.
        wandb_save_dir: Where wandb keeps its files.
        wandb_mode: "auto" (offline without WANDB_API_KEY), "online", "offline", "disabled".
        jsonl_path: Needed by "jsonl" (config key `logging.metrics_jsonl_path`).
        run_config: Stored with the wandb run.

    Raises:
        ValueError: An unknown kind, or a writer without its required setting.
        ImportError: The tensorboard or wandb package is not installed.
    """
    builders = {
        "console": lambda: ConsoleMetricWriter(train_iters),
        "jsonl": lambda: JsonlMetricWriter(_required(jsonl_path, "jsonl", "metrics_jsonl_path")),
        "tensorboard": lambda: TensorBoardMetricWriter(
            _required(tensorboard_dir, "tensorboard", "tensorboard_dir")
        ),
        "wandb": lambda: WandbMetricWriter(
            _required(wandb_project, "wandb", "wandb_project"),
            wandb_exp_name, wandb_save_dir, wandb_mode, run_config,
        ),
    }
    for kind in kinds:
        if kind not in builders:
            raise ValueError(
                f"unknown metric writer '{kind}' in {METRIC_WRITERS_KEY}; "
                f"choose from {', '.join(builders)}"
            )
    return [builders[kind]() for kind in kinds]


def _required(value: Any, kind: str, key: str) -> Any:
    if value is None:
        raise ValueError(f"metric writer '{kind}' needs logging.{key} to be set")
    return value


def _require_package(package: str, kind: str) -> None:
    if not _is_importable(package):
        raise ImportError(
            f"metric writer '{kind}' needs the '{package}' package: pip install {package}, "
            f"or remove '{kind}' from {METRIC_WRITERS_KEY}"
        )


def _is_importable(name: str) -> bool:
    if name in sys.modules:
        return sys.modules[name] is not None
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
