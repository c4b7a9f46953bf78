"""Megatron-LM's timers: ``--timing-log-level``, ``--timing-log-option`` and
``--log-timers-to-tensorboard``, through megatron-core's own ``Timers``.

What is timed, under Megatron-LM's names (``--timing-log-level`` picks how much):

- level 0: nothing beyond the step time every iteration already measures;
- level 1: ``forward-backward`` (megatron-core's pipeline schedules), the gradient reductions
  of ``finalize_model_grads`` (``all-grads-sync``, ``embedding-grads-all-reduce``, ...), the
  optimizer's phases (megatron-core's ``optimizer-copy-to-main-grad``, ``-unscale-and-check-inf``,
  ``-inner-step``, ``-copy-main-to-model-params``, ``params-all-gather``; the step's grad norm
  and clipping as ``optimizer-clip-main-grad``, the zero count as ``optimizer-count-zeros``, as
  megatron-core's own ``step`` times them) and the whole ``optimizer`` step;
- level 2: also each micro-batch's ``forward-compute`` / ``backward-compute`` and the pipeline's
  send/receive timers (megatron-core), and ``batch-generator``: here the step's data and packing
  schedule, produced once per step before the pipeline schedule runs (Megatron-LM times each
  micro-batch's ``get_batch`` inside ``forward-compute``).

Every ``--log-interval`` iterations, as Megatron-LM's ``training_log``: at level >= 1 the last
rank prints megatron-core's block (``(min, max) time across ranks (ms):`` with
``--timing-log-option minmax``, ``max time across ranks (ms):`` with ``max``, every rank's with
``all``), each timer's total over the interval divided by its iterations; with
``--log-timers-to-tensorboard`` the iteration's metrics record gains ``iteration-time`` (the
interval's mean step time, seconds, the console line's ``elapsed time per iteration``), each
measured timer's maximum over ranks as ``<name>-time`` (seconds per iteration), and with
``--log-throughput`` ``throughput`` (TFLOP/s per device over the interval): TensorBoard and
wandb write them under those names, the JSONL record carries them. Timers never measured (a
send on a single stage) are left out, as megatron-core leaves them out.
"""

from __future__ import annotations

from contextlib import contextmanager

from megatron.core.timers import Timers

from megatron.varlen_training.config.logging import LoggingConfig
from megatron.varlen_training.iteration_metrics import (
    ITERATION_TIME_KEY, THROUGHPUT_KEY, TIMER_SUFFIX,
)
LEVEL_1_TIMERS = (
    "forward-backward", "layernorm-grads-all-reduce", "embedding-grads-all-reduce",
    "all-grads-sync", "params-all-gather", "optimizer-copy-to-main-grad",
    "optimizer-unscale-and-check-inf", "optimizer-clip-main-grad", "optimizer-count-zeros",
    "optimizer-inner-step", "optimizer-copy-main-to-model-params", "optimizer",
)
"""Megatron-LM's ``training_log`` list of level-1 timers, in its order."""
LEVEL_2_TIMERS = (
    "batch-generator", "forward-compute", "backward-compute", "forward-recv", "forward-send",
    "backward-recv", "backward-send", "forward-send-forward-recv", "forward-send-backward-recv",
    "backward-send-forward-recv", "backward-send-backward-recv",
    "forward-backward-send-forward-backward-recv",
)
"""Megatron-LM's level-2 timers, in its order."""
OPTIMIZER, BATCH_GENERATOR = "optimizer", "batch-generator"
CLIP_MAIN_GRAD, COUNT_ZEROS = "optimizer-clip-main-grad", "optimizer-count-zeros"
LEVEL_1, LEVEL_2 = 1, 2


@contextmanager
def timed(timers: Timers | None, name: str, level: int, barrier: bool = False):
    """Times the block as megatron-core's timer ``name`` of ``level`` (nothing without timers or
    below the run's level: megatron-core then hands out a no-op timer)."""
    if timers is None:
        yield
        return
    timer = timers(name, log_level=level)
    timer.start(barrier=barrier)
    try:
        yield
    finally:
        timer.stop()


class StepTimers:
    """The run's timers and their interval (module docstring).

    Args:
        logging: The run's logging settings (level, option, --log-interval, the flags).
        is_last_rank: Whether this rank prints (Megatron-LM's last rank).
        print_line: How the last rank prints the block.
    """

    def __init__(self, logging: LoggingConfig, is_last_rank: bool, print_line):
        self.level = logging.timing_log_level
        self.interval = logging.log_interval
        self.to_tensorboard = logging.log_timers_to_tensorboard
        self.with_throughput = logging.log_throughput
        # Level 0 times nothing: megatron-core then gets no timers at all.
        self.core = Timers(self.level, logging.timing_log_option) if self.level >= LEVEL_1 \
            else None
        self._is_last_rank = is_last_rank
        self._print_line = print_line
        self._iterations, self._seconds, self._device_tflop = 0, 0.0, 0.0

    def timed(self, name: str, level: int):
        """Times the block as ``name`` (see :func:`timed`)."""
        return timed(self.core, name, level)

    def _names(self) -> list[str]:
        return list(LEVEL_1_TIMERS) + (list(LEVEL_2_TIMERS) if self.level >= LEVEL_2 else [])

    def end_step(self, iteration: int, step_time_s: float,
                 tflops_per_device: float) -> dict[str, float]:
        """Counts the step; at the end of a --log-interval prints the block and returns the
        record's timer values (empty otherwise, and without --log-timers-to-tensorboard). A
        collective at interval ends: every rank calls it after every step."""
        self._iterations += 1
        self._seconds += step_time_s
        self._device_tflop += tflops_per_device * step_time_s
        if iteration % self.interval:
            return {}
        values = self._interval_values()
        self._iterations, self._seconds, self._device_tflop = 0, 0.0, 0.0
        return values if self.to_tensorboard else {}

    def _interval_values(self) -> dict[str, float]:
        values = {ITERATION_TIME_KEY: self._seconds / self._iterations}
        if self.with_throughput and self._seconds > 0:
            values[THROUGHPUT_KEY] = self._device_tflop / self._seconds
        if self.core is None:
            return values
        names = self._names()
        # What megatron-core's Timers.write computes (the max over ranks of each measured
        # timer, per iteration), read directly: its write() accepts only a SummaryWriter or the
        # wandb module, while the values go into the record for every writer here. Both calls
        # are collectives over every rank; the block resets the timers.
        min_max = self.core._get_global_min_max_time(names, reset=False, barrier=False,
                                                     normalizer=self._iterations)
        block = self.core.get_all_timers_string(names, normalizer=self._iterations, reset=True)
        if self._is_last_rank and block is not None:
            self._print_line(block)
        values.update({name + TIMER_SUFFIX: longest for name, (_, longest) in min_max.items()})
        return values
