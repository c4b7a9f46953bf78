"""Stopping a run early and cleanly: ``--exit-signal-handler`` (with ``--exit-signal``),
``--exit-interval``, ``--exit-duration-in-mins`` (Megatron-LM's flags).

Cluster schedulers send SIGTERM some time before they kill a job (preemption, the end of the
wall-clock allocation; some send another signal, named by ``--exit-signal``), and people press
Ctrl-C (SIGINT). With ``--exit-signal-handler`` such a signal no longer kills the process: the
current iteration finishes, a checkpoint is saved (with ``--save``) and the run exits with code
0, to be resumed with ``--load``.
``--exit-interval N`` stops after every iteration that is a multiple of N, and
``--exit-duration-in-mins M`` once M minutes have passed since the run started (set-up
included: the scheduler's clock counts it too).

Ranks must stop after the SAME iteration, or the ones that go on wait forever in the next
step's collectives: a signal may reach only some ranks, and each rank's clock crosses the
duration at its own moment. So once per iteration, only when one of these two flags is set,
one all-reduce (MAX over the world, two integers: the signal number caught, if any, and
whether the time is up) makes every rank take the same decision. The interval needs none: every
rank counts the same iterations.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import torch

from megatron.varlen_training.config import TrainingConfig
from megatron.varlen_training.errors import UserInputError
from megatron.varlen.platform import get_device

EXIT_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# Caught beside --exit-signal: Ctrl-C on an interactive run stops it cleanly too.
ALWAYS_CAUGHT = signal.SIGINT


def exit_signals(exit_signal: signal.Signals = signal.SIGTERM) -> tuple[signal.Signals, ...]:
    """The signals ``--exit-signal-handler`` catches: ``--exit-signal`` (Megatron-LM's choice,
    SIGTERM by default) and SIGINT; another signal keeps its own handling."""
    return tuple(dict.fromkeys((signal.Signals(exit_signal), ALWAYS_CAUGHT)))
SECONDS_PER_MINUTE = 60.0
_NO_SIGNAL = 0
_SIGNAL, _TIME_UP = 0, 1


class SignalCatcher:
    """Catches ``signals`` (SIGTERM/SIGINT unless told) while active: the first one is remembered
    (:attr:`received`) instead of ending the process; the previous handlers come back on exit.

    A second signal restores the previous handlers and delivers itself again: the process then
    ends as it would have without the flag. Someone who insists (a second Ctrl-C, a scheduler's
    repeated SIGTERM) is never ignored, e.g. while a peer hangs in a collective.
    """

    def __init__(self, signals=EXIT_SIGNALS):
        self.signals = tuple(signals)
        self.received: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> SignalCatcher:
        if threading.current_thread() is not threading.main_thread():
            raise UserInputError("--exit-signal-handler needs the training loop in the main "
                                 "thread (Python delivers signals there only); run it there or "
                                 "drop the flag")
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        self._restore()

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        del frame
        if self.received is None:
            self.received = signum
            return
        self._restore()
        os.kill(os.getpid(), signum)


class ExitConditions:
    """Decides after each iteration whether the run stops there (module docstring).

    A context manager: catching signals (``--exit-signal-handler``) starts on entry and ends
    on exit; the duration counts from construction.

    Args:
        interval: ``--exit-interval`` (None: unset).
        duration_mins: ``--exit-duration-in-mins`` (None: unset).
        signal_handler: ``--exit-signal-handler``.
        exit_signal: ``--exit-signal``: what the handler catches beside SIGINT.
        started_at: ``time.monotonic()`` when the run started (default: now).
    """

    def __init__(self, interval: int | None = None, duration_mins: float | None = None,
                 signal_handler: bool = False, started_at: float | None = None,
                 exit_signal: signal.Signals = signal.SIGTERM):
        self.started_at = time.monotonic() if started_at is None else started_at
        self.interval = interval
        self.duration_mins = duration_mins
        self.catcher = SignalCatcher(exit_signals(exit_signal)) if signal_handler else None

    @classmethod
    def of(cls, training: TrainingConfig) -> ExitConditions:
        """The exit conditions a run's training config sets, its clock starting now."""
        return cls(training.exit_interval, training.exit_duration_in_mins,
                   training.exit_signal_handler, exit_signal=training.exit_signal)

    def __enter__(self) -> ExitConditions:
        if self.catcher is not None:
            self.catcher.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.catcher is not None:
            self.catcher.__exit__(*exc)

    @property
    def needs_agreement(self) -> bool:
        """Whether a rank-local event (signal, clock) can stop the run: then ranks agree."""
        return self.catcher is not None or self.duration_mins is not None

    def elapsed_mins(self) -> float:
        return (time.monotonic() - self.started_at) / SECONDS_PER_MINUTE

    def _agreed_events(self) -> tuple[int, bool]:
        """(signal number caught on any rank, 0 if none; time up on any rank), on every rank."""
        flags = torch.tensor([_NO_SIGNAL, 0], dtype=torch.int32, device=get_device())
        if self.catcher is not None and self.catcher.received is not None:
            flags[_SIGNAL] = self.catcher.received
        if self.duration_mins is not None and self.elapsed_mins() > self.duration_mins:
            flags[_TIME_UP] = 1
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
        signum, time_up = flags.tolist()
        return signum, bool(time_up)

    def reason(self, iteration: int) -> str | None:
        """Why the run stops after ``iteration`` (the same on every rank), or None.

        Every rank must call it after every iteration (it may hold a collective).
        """
        if self.needs_agreement:
            signum, time_up = self._agreed_events()
            if signum != _NO_SIGNAL:
                return (f"{signal.Signals(signum).name} received (--exit-signal-handler; a "
                        f"signal on any rank stops every rank)")
            if time_up:
                return (f"{self.elapsed_mins():.3g} minutes since the start passed "
                        f"--exit-duration-in-mins {self.duration_mins:g}")
        if self.interval is not None and iteration % self.interval == 0:
            return f"iteration {iteration} is a multiple of --exit-interval {self.interval}"
        return None
