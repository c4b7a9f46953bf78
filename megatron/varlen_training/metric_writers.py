"""Where an iteration's metrics go: one protocol, four writers, one builder for both entry points.

Every writer takes the iteration's record in the one JSONL schema
(:func:`megatron.varlen_training.iteration_metrics.to_json_record`) on the last rank, the rank
that owns the loss: the console (Megatron-LM's iteration line every ``log_interval``), a JSONL
file (``--log-metrics-jsonl``), TensorBoard (``--tensorboard-dir``) and wandb
(``--wandb-project``; offline unless ``$WANDB_MODE`` or an API key says otherwise).
:func:`build_metric_writers` turns a :class:`LoggingConfig` into the run's writers;
``pretrain_gpt.py``/``pretrain_mamba.py`` and ``MegatronWrap`` build theirs with it, so the same
run writes the same records through the same writers. TensorBoard and wandb are optional
packages (the ``[metrics]`` extra), imported only when their writer is built.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from megatron.varlen_training.config.logging import LoggingConfig
from megatron.varlen_training.flag_ranges import is_importable
from megatron.varlen_training.iteration_metrics import (
    ITERATION_KEY, LOSS_KEY, format_log_line, is_averaged_loss_key, is_timer_key, perplexity,
)
from megatron.varlen_training.log import info_all_ranks
from megatron.varlen_training.log_interval import LogInterval

WANDB_API_KEY_ENV_VAR = "WANDB_API_KEY"
WANDB_MODE_ENV_VAR = "WANDB_MODE"  # wandb's own setting: offline, online, disabled
# The package each optional writer imports (the [metrics] extra).
TENSORBOARD_PACKAGE, WANDB_PACKAGE = "tensorboard", "wandb"
MEGATRON_LM_KEYS = {"lr": "learning-rate", "global_batch_size": "batch-size",
                    "lm_loss": "lm loss", "loss_scale": "loss-scale", "grad_norm": "grad-norm",
                    "num_zeros_in_grad": "num-zeros", "params_norm": "params-norm"}
"""The record's values Megatron-LM's ``training_log`` also writes, by their name there (its
order). TensorBoard gets each at the iteration and, as ``<name> vs samples``, at the consumed
samples; wandb at the iteration, with ``samples vs steps``. The record's own keys stay beside
them (the JSONL names, and the values Megatron-LM has no key for)."""
VS_SAMPLES = " vs samples"
SAMPLES_VS_STEPS = "samples vs steps"  # Megatron-LM's wandb key of the consumed samples
LOSS_SCALE_KEYS = ("loss_scale", "loss-scale")  # the record's and Megatron-LM's name
WORLD_SIZE_NAME = "world-size"  # Megatron-LM's scalar of --log-world-size-to-tensorboard
MOE_PER_LAYER_PREFIX = "moe/"  # --moe-per-layer-logging's "moe/<loss>_layer_<i>" scalars


@dataclass(frozen=True)
class ScalarOptions:
    """Megatron-LM's switches of what TensorBoard and wandb get beside the record.

    Args:
        loss_scale: Write the loss scale (``--no-log-loss-scale-to-tensorboard`` clears it).
        world_size: The run's world size, written as ``world-size`` (and ``world-size vs
            samples``); None: not written (``--log-world-size-to-tensorboard`` sets it).
    """

    loss_scale: bool = True
    world_size: int | None = None


class MetricWriter(Protocol):
    """Receives one record of scalar metrics per iteration; used on the last rank only."""

    def write(self, iteration: int, record: Mapping[str, Any]) -> None:
        """Records ``record`` (the JSONL schema) for ``iteration``."""

    def write_evaluation(self, name: str, loss: float, iteration: int, consumed_samples: int,
                         metrics: Mapping[str, float] | None = None) -> None:
        """Records an evaluation's lm loss and ``metrics`` (a facade flow's own metrics, by
        name; ``name``: ``validation`` or ``test``) after ``iteration``, trained on
        ``consumed_samples`` samples."""

    def close(self) -> None:
        """Flushes and releases the backend."""


def evaluation_key(name: str, metric: str = "lm loss") -> str:
    """Megatron-LM's TensorBoard/wandb key of an evaluation's ``metric`` (``{key} validation``
    for every key of its loss dict): ``lm loss validation``, and ``lm loss test`` for the test
    split (Megatron-LM writes that one under the validation key too, over the final validation
    point of the same iteration; here it keeps its own); a flow metric ``nll``: ``nll
    validation``."""
    return f"{metric} {name}"


def evaluation_values(name: str, loss: float,
                      metrics: Mapping[str, float] | None = None) -> dict[str, float]:
    """An evaluation's values by their TensorBoard/wandb key (:func:`evaluation_key`)."""
    values = {evaluation_key(name): to_python(loss)}
    values.update({evaluation_key(name, metric): to_python(value)
                   for metric, value in (metrics or {}).items()})
    return values


def to_python(value: Any) -> Any:
    """Turns 0-d tensors and numpy scalars into Python numbers; other values pass through."""
    return value.item() if hasattr(value, "item") else value


class ConsoleMetricWriter:
    """Logs Megatron-LM's iteration line every ``interval`` iterations and after the first one
    it is given (on the calling rank), averaged over the iterations since the last line as
    Megatron-LM averages it (log_interval.py; a first line between multiples starts no new
    interval: the next line covers the iterations since the last multiple).

    Args:
        train_iters: The ``M`` of ``iteration N/ M``.
        interval: Print iterations that are multiples of this (``--log-interval``).
        log_throughput: Print ``throughput per GPU (TFLOP/s/GPU)`` (``--log-throughput``).
    """

    def __init__(self, train_iters: int, interval: int = 1, log_throughput: bool = False):
        self.train_iters = train_iters
        self.interval = interval
        self.log_throughput = log_throughput
        self._since_last_line = LogInterval()
        self._first = True

    def write(self, iteration: int, record: Mapping[str, Any]) -> None:
        line = {ITERATION_KEY: iteration, **{k: to_python(v) for k, v in record.items()}}
        self._since_last_line.add(line)
        first, self._first = self._first, False
        interval_ends = iteration % self.interval == 0
        if interval_ends or first:
            info_all_ranks(format_log_line(self._since_last_line.summary(line),
                                           self.train_iters, self.log_throughput))
        # Megatron-LM never starts a new interval after its first line, even when the first
        # iteration ends one (it then counts that iteration in two lines); here it does.
        if interval_ends:
            self._since_last_line = LogInterval()

    def write_evaluation(self, name: str, loss: float, iteration: int, consumed_samples: int,
                         metrics: Mapping[str, float] | None = None) -> None:
        pass  # the validation line is printed by loop_steps.log_validation_loss

    def close(self) -> None:
        pass


class JsonlMetricWriter:
    """Appends one JSON object per iteration, ``{"iteration": 3, "lm_loss": 4.12, ...}``.

    Args:
        path: The file; missing parent folders are created.
    """

    def __init__(self, path: str | Path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a", encoding="utf-8")

    def write(self, iteration: int, record: Mapping[str, Any]) -> None:
        line = {ITERATION_KEY: iteration, **{k: to_python(v) for k, v in record.items()}}
        self._file.write(json.dumps(line) + "\n")
        self._file.flush()

    def write_evaluation(self, name: str, loss: float, iteration: int, consumed_samples: int,
                         metrics: Mapping[str, float] | None = None) -> None:
        pass  # one record per training iteration: evaluations are in the other writers

    def close(self) -> None:
        self._file.close()


def _numbers(record: Mapping[str, Any]) -> dict[str, float]:
    """The record's numeric entries but the iteration (the step they are logged at); a grad
    norm the fp16 scaler skipped is None: left out."""
    values = {key: to_python(value) for key, value in record.items() if key != ITERATION_KEY}
    return {key: value for key, value in values.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)}


def megatron_lm_scalars(record: Mapping[str, Any],
                        options: ScalarOptions = ScalarOptions()) -> dict[str, float]:
    """The record's values under Megatron-LM's TensorBoard/wandb names (MEGATRON_LM_KEYS), as
    ``options`` say (no ``loss-scale``, a ``world-size``)."""
    numbers = _numbers(record)
    scalars = {name: numbers[key] for key, name in MEGATRON_LM_KEYS.items() if key in numbers}
    if not options.loss_scale:
        scalars.pop(MEGATRON_LM_KEYS["loss_scale"], None)
    if options.world_size is not None:
        scalars[WORLD_SIZE_NAME] = options.world_size
    return scalars


def _own_numbers(record: Mapping[str, Any], options: ScalarOptions) -> dict[str, float]:
    """The record's numbers under its own keys (without the loss scale if ``options`` say)."""
    numbers = _numbers(record)
    if not options.loss_scale:
        numbers = {key: value for key, value in numbers.items() if key not in LOSS_SCALE_KEYS}
    return numbers


def _due(iteration: int, interval: int) -> bool:
    """``--tensorboard-log-interval``: Megatron-LM writes its scalars at its multiples."""
    return iteration % interval == 0


def _is_every_iteration_key(key: str) -> bool:
    """Values Megatron-LM writes whatever --tensorboard-log-interval says: the timers
    (--log-timers-to-tensorboard, every --log-interval: the record has them then) and the MoE
    and MTP losses, per layer too (megatron-core's ``track_moe_metrics`` and
    ``MTPLossLoggingHelper.track_mtp_metrics``, which ``training_log`` calls every iteration
    with its TensorBoard and wandb writers)."""
    return (is_timer_key(key) or key.startswith(MOE_PER_LAYER_PREFIX)
            or (is_averaged_loss_key(key) and key != LOSS_KEY))


def _every_iteration_values(record: Mapping[str, Any]) -> dict[str, float]:
    """The record's values written at every iteration (:func:`_is_every_iteration_key`)."""
    return {key: value for key, value in _numbers(record).items()
            if _is_every_iteration_key(key)}


class TensorBoardMetricWriter:
    """Writes each metric as a scalar of a ``torch.utils.tensorboard.SummaryWriter``.

    Args:
        log_dir: The event files' folder.
        validation_ppl: Also write each evaluation's perplexity
            (``--log-validation-ppl-to-tensorboard``).
        interval: Write the iterations that are multiples of this
            (``--tensorboard-log-interval``); the MoE and MTP losses and the timers are
            written at every iteration the record has them, as in Megatron-LM.
        queue_size: Events queued before the writer flushes them (``--tensorboard-queue-size``,
            the SummaryWriter's ``max_queue``).
        options: Megatron-LM's switches of the loss scale and world size scalars.
    """

    def __init__(self, log_dir: str | Path, validation_ppl: bool = False, interval: int = 1,
                 queue_size: int = 1000, options: ScalarOptions = ScalarOptions()):
        summary_writer_class = importlib.import_module("torch.utils.tensorboard").SummaryWriter
        self._writer = summary_writer_class(log_dir=str(log_dir), max_queue=queue_size)
        self._validation_ppl = validation_ppl
        self._interval = interval
        self._options = options

    def write(self, iteration: int, record: Mapping[str, Any]) -> None:
        """The record's numbers under its own keys, then Megatron-LM's scalars (its names, per
        iteration and ``vs samples``)."""
        if not _due(iteration, self._interval):
            for name, value in _every_iteration_values(record).items():
                self._writer.add_scalar(name, value, iteration)
            return
        for name, value in _own_numbers(record, self._options).items():
            self._writer.add_scalar(name, value, iteration)
        samples = record.get("consumed_samples")
        for name, value in megatron_lm_scalars(record, self._options).items():
            self._writer.add_scalar(name, value, iteration)
            if samples is not None:
                self._writer.add_scalar(name + VS_SAMPLES, value, samples)

    def write_evaluation(self, name: str, loss: float, iteration: int, consumed_samples: int,
                         metrics: Mapping[str, float] | None = None) -> None:
        """Megatron-LM's two scalars of each value: per iteration and ``vs samples``; with
        ``validation_ppl`` also the lm loss's perplexity (``... ppl``, ``... ppl vs samples``;
        not the flow metrics', which need not be losses)."""
        values = evaluation_values(name, loss, metrics)
        if self._validation_ppl:
            values[f"{evaluation_key(name)} ppl"] = perplexity(to_python(loss))
        for key, value in values.items():
            self._writer.add_scalar(key, value, iteration)
            self._writer.add_scalar(key + VS_SAMPLES, value, consumed_samples)

    def close(self) -> None:
        self._writer.close()


def resolve_wandb_mode(mode: str) -> str:
    """``auto``: ``$WANDB_MODE`` if set, else online with ``$WANDB_API_KEY``, else offline (a
    run without network or account never blocks on a login); other modes as given."""
    if mode != "auto":
        return mode
    if os.environ.get(WANDB_MODE_ENV_VAR):
        return os.environ[WANDB_MODE_ENV_VAR]
    return "online" if os.environ.get(WANDB_API_KEY_ENV_VAR) else "offline"


class WandbMetricWriter:
    """Logs metrics to a wandb run.

    Args:
        project: The wandb project.
        name: The run name.
        save_dir: Where wandb keeps its files.
        mode: ``auto`` (:func:`resolve_wandb_mode`), ``online``, ``offline`` or ``disabled``.
        config: Stored with the run (the run's flag values).
        interval: Log the iterations that are multiples of this
            (``--tensorboard-log-interval``, as Megatron-LM's wandb logging follows it); the
            MoE and MTP losses and the timers at every iteration the record has them, as there.
        entity: The run's wandb entity (``--wandb-entity``; None: wandb's default).
        options: Megatron-LM's switches of the loss scale and world size scalars.
    """

    def __init__(self, project: str, name: str | None = None, save_dir: str | None = None,
                 mode: str = "auto", config: Mapping[str, Any] | None = None,
                 interval: int = 1, entity: str | None = None,
                 options: ScalarOptions = ScalarOptions()):
        wandb = importlib.import_module(WANDB_PACKAGE)
        if save_dir is not None:
            os.makedirs(save_dir, exist_ok=True)  # wandb writes below it, and wants it there
        self._run = wandb.init(project=project, name=name, dir=save_dir, entity=entity,
                               mode=resolve_wandb_mode(mode), config=dict(config or {}))
        self._interval = interval
        self._options = options

    def write(self, iteration: int, record: Mapping[str, Any]) -> None:
        """The record's numbers, Megatron-LM's names of them and its ``samples vs steps``."""
        if not _due(iteration, self._interval):
            if values := _every_iteration_values(record):
                self._run.log(values, step=iteration)
            return
        values = {**_own_numbers(record, self._options),
                  **megatron_lm_scalars(record, self._options)}
        if record.get("consumed_samples") is not None:
            values[SAMPLES_VS_STEPS] = to_python(record["consumed_samples"])
        self._run.log(values, step=iteration)

    def write_evaluation(self, name: str, loss: float, iteration: int, consumed_samples: int,
                         metrics: Mapping[str, float] | None = None) -> None:
        self._run.log(evaluation_values(name, loss, metrics), step=iteration)

    def close(self) -> None:
        self._run.finish()


def missing_packages(logging: LoggingConfig) -> list[str]:
    """The optional packages the configured writers need that are not installed."""
    needed = [TENSORBOARD_PACKAGE] if logging.tensorboard_dir else []
    needed += [WANDB_PACKAGE] if logging.wandb_project else []
    return [package for package in needed if not is_importable(package)]


def scalar_options(logging: LoggingConfig, world_size: int | None) -> ScalarOptions:
    """The run's :class:`ScalarOptions` (``world_size``: the run's, written only with
    ``--log-world-size-to-tensorboard``)."""
    return ScalarOptions(loss_scale=logging.log_loss_scale_to_tensorboard,
                         world_size=world_size if logging.log_world_size_to_tensorboard
                         else None)


def build_metric_writers(logging: LoggingConfig, train_iters: int,
                         run_flags: Mapping[str, Any] | None = None,
                         console: bool = True, world_size: int | None = None
                         ) -> list[MetricWriter]:
    """The writers ``logging`` turns on, in a fixed order: console (unless ``console`` is
    False), JSONL, TensorBoard, wandb (with ``run_flags`` as its run's config; ``world_size``
    for ``--log-world-size-to-tensorboard``)."""
    options = scalar_options(logging, world_size)
    writers: list[MetricWriter] = []
    if console:
        writers.append(ConsoleMetricWriter(train_iters, logging.log_interval,
                                           logging.log_throughput))
    if logging.log_metrics_jsonl:
        writers.append(JsonlMetricWriter(logging.log_metrics_jsonl))
    if logging.tensorboard_dir:
        writers.append(TensorBoardMetricWriter(logging.tensorboard_dir,
                                               logging.log_validation_ppl_to_tensorboard,
                                               logging.tensorboard_log_interval,
                                               logging.tensorboard_queue_size, options))
    if logging.wandb_project:
        writers.append(WandbMetricWriter(logging.wandb_project, logging.wandb_exp_name,
                                         logging.wandb_save_dir, logging.wandb_mode, run_flags,
                                         logging.tensorboard_log_interval,
                                         logging.wandb_entity, options))
    return writers
