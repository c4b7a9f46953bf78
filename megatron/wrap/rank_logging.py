"""Rank-aware logging for `megatron.wrap`: prefixed log lines, print/warning capture, a rank-0
progress line and metric writers (console, JSONL, TensorBoard, wandb).

Every line starts with the rank and its parallel coordinates, e.g.
`[rank 3 | tp 1 pp 0 dp 1 cp 0] INFO loaded 12 samples`. The coordinates come from a provider
the facade installs with `set_coordinates_provider`; without one they come from
torch.distributed and megatron-core's parallel_state when those are initialised, else from the
`RANK` environment variable. Nothing here imports torch or needs a process group.
"""

import builtins
import contextlib
import importlib
import importlib.util
import json
import logging
import os
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

# The JSONL writer is the training layer's: one schema for both entry points (no torch either).
from megatron.training.iteration_metrics import ITERATION_KEY, JsonlMetricWriter

LOGGER_NAME = "megatron.wrap"
RANK_ENV_VAR = "RANK"
WANDB_API_KEY_ENV_VAR = "WANDB_API_KEY"
COORDINATE_NAMES = ("tp", "pp", "dp", "cp")
"""Parallel coordinates shown after the rank, in this order (others follow as given)."""
PROGRESS_BAR_WIDTH = 20
METRIC_WRITERS_KEY = "logging.metric_writers"
"""The config key that lists metric writers, named in errors."""

CoordinatesProvider = Callable[[], Mapping[str, int]]
"""Returns `{"rank": r, "tp": .., "pp": .., "dp": .., "cp": ..}`; only "rank" is required."""

_coordinates_provider: CoordinatesProvider | None = None


# --- coordinates and prefix ----------------------------------------------------------------


def set_coordinates_provider(provider: CoordinatesProvider | None) -> None:
    """Installs the function that tells each log line its rank and coordinates (None: default)."""
    global _coordinates_provider
    _coordinates_provider = provider


def get_coordinates() -> dict[str, int]:
    """Returns this process's rank and parallel coordinates (see `CoordinatesProvider`)."""
    if _coordinates_provider is not None:
        return dict(_coordinates_provider())
    coordinates = {"rank": _default_rank()}
    coordinates.update(_megatron_coordinates())
    return coordinates


def get_rank() -> int:
    """Returns the global rank used for rank-0 filtering."""
    return int(get_coordinates()["rank"])


def format_prefix(coordinates: Mapping[str, int]) -> str:
    """Returns `[rank 3 | tp 1 pp 0 dp 1 cp 0]`, or `[rank 3]` without parallel coordinates."""
    names = [name for name in COORDINATE_NAMES if name in coordinates]
    names += [name for name in coordinates if name not in COORDINATE_NAMES and name != "rank"]
    parallel = " ".join(f"{name} {coordinates[name]}" for name in names)
    rank = f"rank {coordinates['rank']}"
    return f"[{rank} | {parallel}]" if parallel else f"[{rank}]"


def _default_rank() -> int:
    torch = sys.modules.get("torch")  # not imported means no process group: never import it
    distributed = getattr(torch, "distributed", None)
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        return distributed.get_rank()
    return int(os.environ.get(RANK_ENV_VAR, "0"))


def _megatron_coordinates() -> dict[str, int]:
    parallel_state = sys.modules.get("megatron.core.parallel_state")
    if parallel_state is None or not parallel_state.model_parallel_is_initialized():
        return {}
    return {
        "tp": parallel_state.get_tensor_model_parallel_rank(),
        "pp": parallel_state.get_pipeline_model_parallel_rank(),
        "dp": parallel_state.get_data_parallel_rank(),
        "cp": parallel_state.get_context_parallel_rank(),
    }


# --- the logger ------------------------------------------------------------------------------


class _StdoutHandler(logging.StreamHandler):
    """Writes to whatever `sys.stdout` is when a record is emitted (so redirection works)."""

    def __init__(self):
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, _value):
        pass  # always the current sys.stdout


def get_logger() -> logging.Logger:
    """Returns the `megatron.wrap` logger, writing to stdout at INFO unless configured."""
    logger = logging.getLogger(LOGGER_NAME)
    if not any(isinstance(handler, _StdoutHandler) for handler in logger.handlers):
        logger.addHandler(_StdoutHandler())
        logger.propagate = False  # our lines are complete; the root logger would repeat them
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.INFO)
    return logger


def set_log_level(level: str | int) -> None:
    """Sets the level of the `megatron.wrap` logger, e.g. "DEBUG" or `logging.WARNING`."""
    get_logger().setLevel(level.upper() if isinstance(level, str) else level)


def _emit(level: int, message: object, args: tuple, rank_0_only: bool) -> None:
    """Logs `message % args`, every line prefixed with the rank and coordinates."""
    coordinates = get_coordinates()
    if rank_0_only and int(coordinates["rank"]) != 0:
        return
    logger = get_logger()
    if not logger.isEnabledFor(level):
        return
    text = str(message) % args if args else str(message)
    head = f"{format_prefix(coordinates)} {logging.getLevelName(level)}"
    logger.log(level, "\n".join(f"{head} {line}" for line in text.split("\n")))


def debug_rank_0(message: object, *args: object) -> None:
    """Logs at DEBUG on global rank 0 only."""
    _emit(logging.DEBUG, message, args, rank_0_only=True)


def info_rank_0(message: object, *args: object) -> None:
    """Logs at INFO on global rank 0 only."""
    _emit(logging.INFO, message, args, rank_0_only=True)


def warning_rank_0(message: object, *args: object) -> None:
    """Logs at WARNING on global rank 0 only."""
    _emit(logging.WARNING, message, args, rank_0_only=True)


def info_all_ranks(message: object, *args: object) -> None:
    """Logs at INFO on every rank."""
    _emit(logging.INFO, message, args, rank_0_only=False)


def warning_all_ranks(message: object, *args: object) -> None:
    """Logs at WARNING on every rank."""
    _emit(logging.WARNING, message, args, rank_0_only=False)


def error_all_ranks(message: object, *args: object) -> None:
    """Logs at ERROR on every rank."""
    _emit(logging.ERROR, message, args, rank_0_only=False)


# --- capturing print() and warnings --------------------------------------------------------


@contextlib.contextmanager
def capture_print(rank_0_only: bool = False) -> Iterator[None]:
    """Routes `print()` to stdout through the logger (INFO) until exit, then restores it.

    Prints to another file (e.g. `file=sys.stderr`) pass through unchanged. Each call is one
    log record, so `end=""` fragments are not joined.

    Args:
        rank_0_only: Drop prints of ranks other than 0.
    """
    original = builtins.print

    def routed_print(*values: object, sep: str | None = " ", end: str | None = "\n",
                     file: Any = None, flush: bool = False) -> None:
        if file is not None and file is not sys.stdout:
            original(*values, sep=sep, end=end, file=file, flush=flush)
            return
        text = (" " if sep is None else sep).join(map(str, values))
        text += "\n" if end is None else end
        _emit(logging.INFO, text.removesuffix("\n"), (), rank_0_only)

    builtins.print = routed_print
    try:
        yield
    finally:
        builtins.print = original


@contextlib.contextmanager
def capture_warnings() -> Iterator[None]:
    """Routes shown warnings through the logger (WARNING, all ranks) until exit, then restores.

    Warnings shown to an explicit file pass through unchanged; the warnings filters (e.g.
    "once per location") still decide which warnings are shown.
    """
    original = warnings.showwarning

    def routed_showwarning(message: Warning | str, category: type[Warning], filename: str,
                           lineno: int, file: Any = None, line: str | None = None) -> None:
        if file is not None:
            original(message, category, filename, lineno, file, line)
            return
        text = f"{category.__name__}: {message} ({filename}:{lineno})"
        _emit(logging.WARNING, text, (), rank_0_only=False)

    warnings.showwarning = routed_showwarning
    try:
        yield
    finally:
        warnings.showwarning = original


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
        info_rank_0(self.render(step, metrics))


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
    """Logs `iteration 3 | lm_loss 4.12 | lr 0.001` (on the calling rank, the last one)."""

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        fields = [f"iteration {step}", *(f"{k} {_format_metric(v)}" for k, v in metrics.items()
                                         if k != ITERATION_KEY)]
        info_all_ranks(" | ".join(fields))

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
        "console": lambda: ConsoleMetricWriter(),
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
