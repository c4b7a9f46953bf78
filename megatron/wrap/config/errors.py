"""The error type of the config tree and the "did you mean" hint it uses."""

import difflib
from collections.abc import Iterable

_HINT_CUTOFF = 0.6
"""Minimum difflib similarity for a name to be offered as the likely intended one."""


class ConfigError(ValueError):
    """A user error in a config: one line naming the key, its file and the fix."""


def closest(name: str, candidates: Iterable[str]) -> str | None:
    """Returns the candidate most similar to `name`, or None if none is close.

    Args:
        name: The misspelt name.
        candidates: The valid names.
    """
    matches = difflib.get_close_matches(name, sorted(candidates), n=1, cutoff=_HINT_CUTOFF)
    return matches[0] if matches else None


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """Returns `"; did you mean 'x'?"` for the closest candidate, or an empty string."""
    match = closest(name, candidates)
    return f"; did you mean '{match}'?" if match else ""
