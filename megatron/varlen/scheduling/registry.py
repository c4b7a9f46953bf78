"""Scheduler registry: the one list of ``--sequence-packing-scheduler`` values and what each
means; name -> pure function ``(ScheduleProblem) -> Schedule``.

The flag's choices and help text (megatron/varlen_training/varlen_arguments.py) and the tools'
choices are built from here.
"""

from __future__ import annotations

from typing import Callable

from megatron.varlen.scheduling.dp_balanced import dp_balanced
from megatron.varlen.scheduling.dynamic_cp import default_dynamic_cp
from megatron.varlen.scheduling.empty import empty
from megatron.varlen.scheduling.problem import Schedule, ScheduleProblem

SchedulerFn = Callable[[ScheduleProblem], Schedule]
SCHEDULER_FLAG = "--sequence-packing-scheduler"
DP_BALANCED, EMPTY, DYNAMIC_CP = "dp_balanced", "empty", "default_dynamic_cp"

_SCHEDULERS: dict[str, SchedulerFn] = {
    DP_BALANCED: dp_balanced,
    EMPTY: empty,
    DYNAMIC_CP: default_dynamic_cp,  # Megatron-LM's name, set by --dynamic-context-parallel
}
DESCRIPTIONS = {
    DP_BALANCED: "balances estimated compute across the DP ranks, every sequence on its "
                 "static CP group",
    EMPTY: "only packs what each DP rank already holds, in order (the sampler assigned it)",
    DYNAMIC_CP: "also gives every sequence its own CP group size, micro-batch by micro-batch "
                "(the scheduler of --dynamic-context-parallel)",
}
# Accepted flag values that name another scheduler. Megatron-LM's early prototypes called
# dp_balanced "default"; old command lines keep working. It is unrelated to default_dynamic_cp.
ALIASES = {"default": DP_BALANCED}


def scheduler_names() -> tuple[str, ...]:
    """Every accepted name (schedulers and aliases), sorted."""
    return tuple(sorted([*_SCHEDULERS, *ALIASES]))


def canonical_name(name: str) -> str:
    """The scheduler ``name`` stands for (an alias resolved; other names unchanged)."""
    return ALIASES.get(name, name)


def scheduler_help() -> str:
    """The flag's help text: what each value means, the alias, the default."""
    meanings = [f"{name}: {DESCRIPTIONS[name]}" for name in _SCHEDULERS]
    aliases = [f"{alias}: alias of {target} (Megatron-LM's early name for it, kept for old "
               f"command lines; not related to {DYNAMIC_CP})" for alias, target in ALIASES.items()]
    return ("How packed sequences are assigned to micro-batches and ranks. "
            + "; ".join(meanings + aliases)
            + f". Unset: {DP_BALANCED}, or {DYNAMIC_CP} with --dynamic-context-parallel.")


def get_scheduler(name: str) -> SchedulerFn:
    """Returns the scheduler registered as ``name`` (an alias gives its target).

    Raises:
        ValueError: for an unknown name (lists the known ones and the flag).
    """
    if canonical_name(name) not in _SCHEDULERS:
        raise ValueError(f"unknown scheduler {name!r}; known: {', '.join(scheduler_names())} "
                         f"(check {SCHEDULER_FLAG})")
    return _SCHEDULERS[canonical_name(name)]
