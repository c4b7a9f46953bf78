"""How a config checks itself: the flags' own rules, from flag_ranges.py (the one place numeric
ranges and the relations between numeric flags are written), raised as the parser's one-line
error naming the flag to change."""

from __future__ import annotations

import dataclasses

from megatron.varlen_training.flag_errors import require
from megatron.varlen_training.flag_ranges import range_problems


def check_ranges(config) -> None:
    """Every field of the dataclass ``config`` named like a numeric flag is in its range."""
    values = {field.name: getattr(config, field.name) for field in dataclasses.fields(config)}
    for problem in range_problems(values):
        require(False, problem)


def check_problems(*problems: str | None) -> None:
    """Raises the first problem that is not None (``flag_ranges.*_problem`` results)."""
    for problem in problems:
        require(problem is None, problem)
