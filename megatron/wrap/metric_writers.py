"""The facade's choice of metric writers (``logging.metric_writers``) and its rank-0 progress line.

The writers themselves are the training layer's (``megatron.varlen_training.metric_writers``),
built by the Trainer for ``pretrain_gpt.py`` and the facade alike from a ``LoggingConfig``;
here the facade's config keys become that config. The log lines, their rank prefix, levels and
print/warning capture are ``megatron.varlen_training.log``'s. Nothing here imports torch.
"""

from collections.abc import Mapping, Sequence
from typing import Any

from megatron.varlen_training.config.logging import LoggingConfig
from megatron.varlen_training.log import print_rank_0
from megatron.varlen_training.metric_writers import (  # noqa: F401 (the facade's writers)
    ConsoleMetricWriter, JsonlMetricWriter, MetricWriter, TensorBoardMetricWriter,
    WandbMetricWriter, missing_packages, to_python,
)
from megatron.varlen_training.metric_writers import build_metric_writers as build_writers
from megatron.wrap.config.errors import ConfigError
from megatron.wrap.config.keys import FACADE_KEYS, METRIC_WRITER_KINDS

PROGRESS_BAR_WIDTH = 20
METRIC_WRITERS_KEY = "logging.metric_writers"
"""The config key that lists metric writers, named in errors."""
WRITER_SETTINGS = {"jsonl": ("metrics_jsonl_path",), "tensorboard": ("tensorboard_dir",),
                   "wandb": ("wandb_project", "wandb_exp_name", "wandb_save_dir",
                             "wandb_entity", "wandb_mode")}
"""The ``logging`` keys that configure each writer: set while their writer is not named they
would change nothing (``pretrain_gpt.py``'s ``--tensorboard-dir`` alone turns TensorBoard on),
so they are refused."""


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
    value = to_python(value)
    return f"{value:.4g}" if isinstance(value, float) else str(value)


# --- metric writers: the training layer's, chosen by logging.metric_writers ------------------


def logging_config(kinds: Sequence[str], *, tensorboard_dir: str | None = None,
                   wandb_project: str | None = None, wandb_exp_name: str | None = None,
                   wandb_save_dir: str | None = None, wandb_mode: str = "auto",
                   jsonl_path: str | None = None) -> tuple[LoggingConfig, bool]:
    """``(the run's LoggingConfig, whether the console writer is on)`` for the writers named in
    ``logging.metric_writers``: each writer's setting is kept only when it is named, and the
    console line is written at every ``log_last_metrics()`` call (interval 1; the facade's run
    takes the config's ``log_interval`` where it sets one: ``runtime.run_config_of``).

    Raises:
        ConfigError: An unknown kind, or a writer without its required setting (ValueErrors).
        ImportError: The tensorboard or wandb package is not installed.
    """
    for kind in kinds:
        if kind not in METRIC_WRITER_KINDS:
            raise ConfigError(f"unknown metric writer '{kind}' in {METRIC_WRITERS_KEY}; "
                             f"choose from {', '.join(METRIC_WRITER_KINDS)}")
    settings = {"jsonl": ("metrics_jsonl_path", jsonl_path),
                "tensorboard": ("tensorboard_dir", tensorboard_dir),
                "wandb": ("wandb_project", wandb_project)}
    for kind, (key, value) in settings.items():
        if kind in kinds and value is None:
            raise ConfigError(f"metric writer '{kind}' needs logging.{key} to be set")
    config = LoggingConfig(
        log_interval=1, log_metrics_jsonl=jsonl_path if "jsonl" in kinds else None,
        tensorboard_dir=tensorboard_dir if "tensorboard" in kinds else None,
        wandb_project=wandb_project if "wandb" in kinds else None,
        wandb_exp_name=wandb_exp_name, wandb_save_dir=wandb_save_dir, wandb_mode=wandb_mode)
    for package in missing_packages(config):
        raise ImportError(f"metric writer '{package}' needs the '{package}' package: pip install "
                          f"{package}, or remove '{package}' from {METRIC_WRITERS_KEY}")
    return config, "console" in kinds


def refuse_unused_writer_settings(facade: Mapping[str, Any]) -> None:
    """A :data:`WRITER_SETTINGS` key set (not at its default) for a writer
    ``logging.metric_writers`` does not name is a one-line ConfigError naming the key, its
    value and both fixes."""
    kinds = list(facade["metric_writers"])
    for kind, keys in WRITER_SETTINGS.items():
        for key in keys:
            if kind not in kinds and facade.get(key) != FACADE_KEYS[key].default:
                raise ConfigError(
                    f"config key 'logging.{key}' ({facade[key]!r}) configures the '{kind}' "
                    f"metric writer, which {METRIC_WRITERS_KEY} {kinds} does not name: add "
                    f"'{kind}' to {METRIC_WRITERS_KEY}, or remove logging.{key}")


def facade_logging_config(facade: Mapping[str, Any]) -> tuple[LoggingConfig, bool]:
    """:func:`logging_config` from a WrapConfig's facade keys (a writer's setting without the
    writer refused: :func:`refuse_unused_writer_settings`)."""
    refuse_unused_writer_settings(facade)
    return logging_config(
        facade["metric_writers"], tensorboard_dir=facade["tensorboard_dir"],
        wandb_project=facade["wandb_project"], wandb_exp_name=facade["wandb_exp_name"],
        wandb_save_dir=facade["wandb_save_dir"], wandb_mode=facade["wandb_mode"],
        jsonl_path=facade["metrics_jsonl_path"])


def build_metric_writers(kinds: Sequence[str], *, train_iters: int,
                         run_config: Mapping[str, Any] | None = None,
                         **settings: Any) -> list[MetricWriter]:
    """The writers named in ``logging.metric_writers`` (``settings``: :func:`logging_config`'s),
    built as the Trainer builds them (call on the last rank).

    Raises:
        ValueError, ImportError: As :func:`logging_config`.
    """
    config, console = logging_config(kinds, **settings)
    return build_writers(config, train_iters, run_config, console=console)
