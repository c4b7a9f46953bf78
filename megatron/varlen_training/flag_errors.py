"""The one-line error of a bad flag, and ``require``, the check every validator uses: the
command line's validators (arguments.py and its flag groups) and the typed configs, which check
themselves (config/). Kept free of other imports so that both can use it."""

from __future__ import annotations


class ArgumentValidationError(ValueError):
    """A bad flag or flag combination; the message is one line naming the flag."""


def require(condition: bool, message: str) -> None:
    """Raises the one-line ArgumentValidationError ``message`` unless ``condition``."""
    if not condition:
        raise ArgumentValidationError(message)
