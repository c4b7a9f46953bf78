"""``--validate-packing-schedules``: a schedule checked against all of its invariants before it
runs (a debug aid: the suite checks the schedulers themselves offline), and the error that names
a broken one. Torch-free, so the entry points' error handling can import it cheaply."""

from __future__ import annotations

from megatron.varlen.scheduling.problem import Schedule, ScheduleProblem
from megatron.varlen.scheduling.registry import DYNAMIC_CP
from megatron.varlen.scheduling.validate import validate_schedule


class InvalidScheduleError(RuntimeError):
    """A scheduler broke one of a schedule's invariants (a bug in the scheduler, not the data).

    Every rank computes the same schedule, so every rank raises it: the entry points print it
    once, in one line, and exit with the "run went wrong" code."""

    exit_code = 1


def check_schedule(problem: ScheduleProblem, schedule: Schedule, scheduler: str) -> None:
    """``validate_schedule`` with the failure named as the scheduler's bug, in one line."""
    # Only the dynamic-CP scheduler may use the groups beyond the static CP groups.
    layout = problem.layout if scheduler == DYNAMIC_CP else problem.static_layout
    try:
        validate_schedule(problem, schedule, layout)
    except AssertionError as broken:
        raise InvalidScheduleError(
            f"scheduler {scheduler!r} produced an invalid schedule for "
            f"{problem.num_sequences} sequences on {problem.num_ranks} ranks: {broken} "
            f"(found by --validate-packing-schedules; please report it)") from None
