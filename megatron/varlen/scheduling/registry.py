"""Scheduler registry: name -> pure function ``(ScheduleProblem) -> Schedule``."""

from __future__ import annotations

from typing import Callable

from megatron.varlen.scheduling.dp_balanced import dp_balanced
from megatron.varlen.scheduling.dynamic_cp import default_dynamic_cp
from megatron.varlen.scheduling.empty import empty
from megatron.varlen.scheduling.problem import Schedule, ScheduleProblem

SchedulerFn = Callable[[ScheduleProblem], Schedule]
SCHEDULER_FLAG = "--sequence-packing-scheduler"

_SCHEDULERS: dict[str, SchedulerFn] = {
    "dp_balanced": dp_balanced,
    "default": dp_balanced,  # historical alias kept by the fork
    "empty": empty,
    "default_dynamic_cp": default_dynamic_cp,
}
# Static schedulers keep every sequence on its static CP group.
STATIC_SCHEDULERS = frozenset({"dp_balanced", "default", "empty"})


def scheduler_names() -> tuple[str, ...]:
    """Registered names, sorted."""
    return tuple(sorted(_SCHEDULERS))


def get_scheduler(name: str) -> SchedulerFn:
    """Returns the scheduler registered as ``name``.

    Raises:
        ValueError: for an unknown name (lists the known ones and the flag).
    """
    if name not in _SCHEDULERS:
        raise ValueError(f"unknown scheduler {name!r}; known: {', '.join(scheduler_names())} "
                         f"(check {SCHEDULER_FLAG})")
    return _SCHEDULERS[name]
