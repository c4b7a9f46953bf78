"""Per-iteration log line (Megatron's shape) and the ONE JSONL metrics schema.

Both entry points build the same record of an iteration (:func:`to_json_record`, keyed by
``"iteration"``; a facade flow appends its own metrics after the shared keys) in the Trainer
and hand it to the same metric writers (metric_writers.py): console, JSONL, TensorBoard, wandb.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

TERA = 1e12
TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S.%f"  # the iteration line's " [...]" (Megatron-LM's)
ITERATION_KEY = "iteration"  # the first key of every JSONL record
LOSS_KEY = "lm_loss"
# 1 when the fp16 loss scaler skipped the step's update (Megatron-LM's ``skipped_iter``).
SKIPPED_ITER_KEY = "skipped_iter"
SHARED_KEYS = (ITERATION_KEY, LOSS_KEY, "grad_norm", "loss_scale", SKIPPED_ITER_KEY, "lr",
               "consumed_samples",
               "global_batch_size", "num_microbatches", "tokens", "seqlen_sum",
               "seqlen_squared_sum", "step_time_s", "tokens_per_s", "tflops_per_device")
"""The keys every record starts with, in this order (:func:`to_json_record`)."""
NUM_ZEROS_KEY = "num_zeros_in_grad"  # only in records of --log-num-zeros-in-grad runs
PARAMS_NORM_KEY = "params_norm"  # only in records of --log-params-norm runs
# --log-timers-to-tensorboard (step_timers.py): Megatron-LM's timer scalars, "<timer>-time"
# (megatron-core's Timers.write), the interval's "iteration-time" and "throughput".
TIMER_SUFFIX, ITERATION_TIME_KEY, THROUGHPUT_KEY = "-time", "iteration-time", "throughput"
# The console line's counts over its --log-interval (log_interval.py), not per-iteration keys.
SKIPPED_ITERATIONS_KEY, NAN_ITERATIONS_KEY = "skipped_iterations", "nan_iterations"
INTERVAL_KEYS = (SKIPPED_ITERATIONS_KEY, NAN_ITERATIONS_KEY)
MAX_LOGGED_LOSS_FOR_PPL = 20.0  # as Megatron: exp() of a diverged loss would overflow
# Losses printed beside lm loss as Megatron-LM prints them (the MoE balancing losses).
LOSS_KEYS = ("load_balancing_loss", "seq_load_balancing_loss", "global_load_balancing_loss",
             "z_loss")
# Megatron-LM's name of the multi-token-prediction loss at each depth (MTPLossLoggingHelper),
# printed after the MoE losses and averaged like them; a record key as it is.
MTP_LOSS_NAME = "mtp_{depth} loss"
_MTP_LOSS_PATTERN = re.compile(r"mtp_\d+ loss")
# Keys of TensorBoard/wandb/JSONL values Megatron-LM never prints on the iteration line: the
# per-layer MoE losses (--moe-per-layer-logging, "moe/<loss>_layer_<i>") and the device
# memory (--log-memory-to-tensorboard, "mem-...-bytes").
SCALAR_ONLY_PREFIXES = ("moe/", "mem-")


@dataclass
class IterationMetrics:
    """What one training iteration reports; None fields are left out of the log line."""

    iteration: int
    train_iters: int
    consumed_samples: int
    step_time_s: float
    learning_rate: float
    global_batch_size: int
    lm_loss: float
    grad_norm: float | None
    num_microbatches: int
    tokens: int  # real (unpadded) tokens in the global batch
    seqlen_sum: int
    seqlen_squared_sum: int
    flops: int
    world_size: int
    loss_scale: float = 1.0  # the fp16 loss scaler's scale after the step (1 without fp16)
    skipped: bool = False  # the fp16 loss scaler skipped the update (grad_norm is None)
    num_zeros_in_grad: int | None = None  # --log-num-zeros-in-grad (None: not counted)
    params_norm: float | None = None  # --log-params-norm (None: not computed)
    extra: dict = field(default_factory=dict)  # padding_ratio, schedule_imbalance, ...
    losses: dict = field(default_factory=dict)  # LOSS_KEYS (MoE), MTP losses of the step
    scalars: dict = field(default_factory=dict)  # SCALAR_ONLY_PREFIXES keys (not on the line)
    timers: dict = field(default_factory=dict)  # --log-timers-to-tensorboard, interval ends

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.step_time_s if self.step_time_s > 0 else 0.0

    @property
    def tflops_per_device(self) -> float:
        if self.step_time_s <= 0:
            return 0.0
        return self.flops / (self.step_time_s * self.world_size * TERA)


def mtp_loss_name(depth: int) -> str:
    """Megatron-LM's name of the MTP loss at ``depth`` (1 = the first MTP layer)."""
    return MTP_LOSS_NAME.format(depth=depth)


def is_mtp_loss_key(key: str) -> bool:
    return _MTP_LOSS_PATTERN.fullmatch(key) is not None


def is_averaged_loss_key(key: str) -> bool:
    """A loss the line averages over the interval's applied iterations: lm loss, the MoE
    losses, the MTP losses."""
    return key == LOSS_KEY or key in LOSS_KEYS or is_mtp_loss_key(key)


def is_scalar_only_key(key: str) -> bool:
    """A record key for TensorBoard, wandb and the JSONL only (:data:`SCALAR_ONLY_PREFIXES`)."""
    return key.startswith(SCALAR_ONLY_PREFIXES)


def is_timer_key(key: str) -> bool:
    """A record key of the timers (step_timers.py): not on the iteration line, where Megatron-LM
    never prints them (its timers have a block of their own)."""
    return key.endswith(TIMER_SUFFIX) or key == THROUGHPUT_KEY


def format_log_line(record: Mapping[str, Any], train_iters: int, log_throughput: bool = False,
                    now: datetime | None = None) -> str:
    """Megatron-LM's iteration line from a JSONL record (:func:`to_json_record`), so both entry
    points print the same line from the same numbers (the console writer hands it the record
    averaged over the --log-interval: log_interval.py)::

         [2026-11-27 02:42:07.123456] iteration        3/      10 | consumed samples: ...

    Megatron-LM's (core_v0.16.1 ``training_log``) fields in its order and number formats, from
    the timestamp (``now``, default the local time, as its ``datetime.now()``) to ``number of
    nan iterations``: ``throughput per GPU`` only with ``log_throughput`` (--log-throughput); a
    loss only when its average is above zero, as there (an interval of skipped iterations
    prints no ``lm loss``). The counts of skipped and NaN iterations are the record's own (one
    iteration) unless it carries the interval's. This fork's additions follow Megatron-LM's
    last field, so a parser of its line reads ours: ``tokens per second``, ``number of
    microbatches``, then the keys beyond the shared schema (the schedule's stats, a facade
    flow's metrics) in record order, ``padding_ratio`` as ``padding ratio: 0.0085``.
    """
    stamp = (now or datetime.now()).strftime(TIMESTAMP_FORMAT)
    parts = [f" [{stamp}] iteration {record[ITERATION_KEY]:8d}/{train_iters:8d}",
             f"consumed samples: {record['consumed_samples']:12d}",
             f"elapsed time per iteration (ms): {record['step_time_s'] * 1000.0:.1f}"]
    if log_throughput:
        parts.append(f"throughput per GPU (TFLOP/s/GPU): {record['tflops_per_device']:.1f}")
    parts += [f"learning rate: {record['lr']:.6E}",
              f"global batch size: {record['global_batch_size']:5d}"]
    parts += [f"{_line_name(key)}: {record[key]:.6E}" for key in _line_losses(record)
              if record[key] is not None and record[key] > 0.0]
    parts += _norm_fields(record)
    parts += _count_fields(record)
    parts += _fork_fields(record)
    return " | ".join(parts) + " |"


def _line_name(key: str) -> str:
    return "lm loss" if key == LOSS_KEY else key


def _line_losses(record: Mapping[str, Any]) -> list[str]:
    """The record's losses in Megatron-LM's order: lm loss, the MoE losses, the MTP losses."""
    return ([LOSS_KEY] + [key for key in LOSS_KEYS if key in record]
            + [key for key in record if is_mtp_loss_key(key)])


def _norm_fields(record: Mapping[str, Any]) -> list[str]:
    """``loss scale`` and, where the record has them, the grad norm, zeros and params norm."""
    parts = [f"loss scale: {record.get('loss_scale', 1.0):.1f}"]
    if record["grad_norm"] is not None:
        parts.append(f"grad norm: {record['grad_norm']:.3f}")
    if record.get(NUM_ZEROS_KEY) is not None:
        parts.append(f"num zeros: {record[NUM_ZEROS_KEY]}")
    if record.get(PARAMS_NORM_KEY) is not None:
        parts.append(f"params norm: {record[PARAMS_NORM_KEY]:.3f}")
    return parts


def _count_fields(record: Mapping[str, Any]) -> list[str]:
    """Megatron-LM's last two fields: the skipped and the NaN iterations."""
    skipped = record.get(SKIPPED_ITER_KEY) or 0
    nan = int(bool(skipped) and not math.isfinite(record[LOSS_KEY] or 0.0))
    return [f"number of skipped iterations: {record.get(SKIPPED_ITERATIONS_KEY, skipped):3d}",
            f"number of nan iterations: {record.get(NAN_ITERATIONS_KEY, nan):3d}"]


def _fork_fields(record: Mapping[str, Any]) -> list[str]:
    """This fork's fields after Megatron-LM's: tokens per second, micro-batches, the rest."""
    parts = [f"tokens per second: {record['tokens_per_s']:.1f}",
             f"number of microbatches: {record['num_microbatches']}"]
    for key, value in record.items():
        if key not in SHARED_KEYS and key not in INTERVAL_KEYS \
                and key not in (NUM_ZEROS_KEY, PARAMS_NORM_KEY) and not is_timer_key(key) \
                and not is_averaged_loss_key(key) and not is_scalar_only_key(key):
            parts.append(f"{key.replace('_', ' ')}: {value:.4f}" if isinstance(value, float)
                         else f"{key.replace('_', ' ')}: {value}")
    return parts


def perplexity(loss: float) -> float:
    """Megatron-LM's perplexity of a logged loss: exp(loss), the loss capped at
    :data:`MAX_LOGGED_LOSS_FOR_PPL`."""
    return math.exp(min(loss, MAX_LOGGED_LOSS_FOR_PPL))


def format_validation_line(iteration: int, loss: float, where: str = "",
                           name: str = "validation") -> str:
    """Megatron-LM's validation line: `` validation loss at iteration 4 | lm loss value: ...``;
    ``where`` follows the iteration (`` on validation set`` / `` on test set`` at the end of
    training), as in Megatron-LM, whose test-split line also starts `` validation loss``;
    ``name``: ``validation-wiki`` for one of --multiple-validation-sets. Each field ends in
    ``| `` there, so the line ends in a space, kept here character for character."""
    return (f" {name} loss at iteration {iteration}{where} | lm loss value: {loss:.6E} | "
            f"lm loss PPL: {perplexity(loss):.6E} | ")


def to_json_record(m: IterationMetrics, extra_metrics: Mapping[str, float] | None = None) -> dict:
    """The JSONL record: one object per iteration; ``extra_metrics`` (a facade flow's own
    metrics) follow the shared keys."""
    record = {
        ITERATION_KEY: m.iteration,
        LOSS_KEY: m.lm_loss,
        "grad_norm": m.grad_norm,
        "loss_scale": m.loss_scale,
        SKIPPED_ITER_KEY: int(m.skipped),
        "lr": m.learning_rate,
        "consumed_samples": m.consumed_samples,
        "global_batch_size": m.global_batch_size,
        "num_microbatches": m.num_microbatches,
        "tokens": m.tokens,
        "seqlen_sum": m.seqlen_sum,
        "seqlen_squared_sum": m.seqlen_squared_sum,
        "step_time_s": m.step_time_s,
        "tokens_per_s": m.tokens_per_s,
        "tflops_per_device": m.tflops_per_device,
    }
    if m.num_zeros_in_grad is not None:
        record[NUM_ZEROS_KEY] = m.num_zeros_in_grad
    if m.params_norm is not None:
        record[PARAMS_NORM_KEY] = m.params_norm
    record.update(m.losses)
    record.update(m.scalars)
    record.update(m.timers)
    record.update(m.extra)
    record.update(extra_metrics or {})
    return record
