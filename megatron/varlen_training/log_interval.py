"""Megatron-LM's averaging of the iteration line over ``--log-interval``.

Megatron-LM's ``training_log`` accumulates every iteration and prints, every ``--log-interval``
iterations (and after the first iteration a process runs, without starting a new interval):

- the losses (``lm loss``, the MoE losses, the MTP losses ``mtp_1 loss``, ...) summed and
  divided by the number of the interval's APPLIED (advanced) iterations. A step the fp16 loss
  scaler skipped adds no ``lm loss``; its MoE and MTP losses are added all the same, as
  megatron-core's ``track_moe_metrics`` and ``MTPLossLoggingHelper.track_mtp_metrics`` add them
  to the interval's totals every iteration, skipped or not (core_v0.16.1 ``training_log``);
- the elapsed time per iteration: the interval's time over all its iterations, skipped ones
  included;
- the number of skipped iterations in the interval, and of those the ones whose loss was not
  finite (``number of nan iterations``);
- everything else (learning rate, batch size, loss scale, grad norm, consumed samples) as the
  current iteration left it.

Here the interval's time is the sum of its steps' times (a step's data included; evaluations and
checkpoint saves between steps are not, as Megatron-LM stops its interval timer for
evaluations), and the throughput and tokens per second are the interval's FLOPs and real tokens
over that time: with packing, steps do unequal work, so a per-step rate is not averaged.
The JSONL, TensorBoard and wandb records stay per iteration, as Megatron-LM's TensorBoard
scalars do.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from megatron.varlen_training.iteration_metrics import (
    LOSS_KEY, NAN_ITERATIONS_KEY, SKIPPED_ITER_KEY, SKIPPED_ITERATIONS_KEY, is_averaged_loss_key,
)


def _is_finite(value: Any) -> bool:
    return value is None or math.isfinite(float(value))


@dataclass
class LogInterval:
    """The iterations since the last printed line (Megatron-LM's ``total_loss_dict``)."""

    applied: int = 0
    skipped: int = 0
    nan: int = 0
    step_time_s: float = 0.0
    tokens: int = 0
    device_tflop: float = 0.0  # sum of tflops_per_device x step time: TFLOP per device
    loss_sums: dict[str, float] = field(default_factory=dict)

    def add(self, record: Mapping[str, Any]) -> None:
        """Counts one iteration's record (the JSONL schema, values as Python numbers)."""
        self.step_time_s += record["step_time_s"]
        self.tokens += record["tokens"]
        self.device_tflop += record["tflops_per_device"] * record["step_time_s"]
        skipped = bool(record.get(SKIPPED_ITER_KEY))
        if skipped:
            self.skipped += 1
            self.nan += int(not _is_finite(record.get(LOSS_KEY)))
        else:
            self.applied += 1
        for key, value in record.items():
            # A skipped step's lm loss stays out; its MoE and MTP losses do not (docstring).
            if is_averaged_loss_key(key) and value is not None \
                    and not (skipped and key == LOSS_KEY):
                self.loss_sums[key] = self.loss_sums.get(key, 0.0) + value

    def summary(self, record: Mapping[str, Any]) -> dict:
        """``record`` (the interval's last iteration) with the interval's averages and
        counts in place of its own values."""
        line = dict(record)
        iterations = self.applied + self.skipped
        for key in line:
            if is_averaged_loss_key(key):
                line[key] = self.loss_sums.get(key, 0.0) / max(1, self.applied)
        if iterations:
            line["step_time_s"] = self.step_time_s / iterations
        if self.step_time_s > 0:
            line["tokens_per_s"] = self.tokens / self.step_time_s
            line["tflops_per_device"] = self.device_tflop / self.step_time_s
        line[SKIPPED_ITERATIONS_KEY] = self.skipped
        line[NAN_ITERATIONS_KEY] = self.nan
        return line
