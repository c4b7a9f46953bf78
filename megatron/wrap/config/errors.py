"""The error type of the config tree and the hints it uses ("did you mean", hybrid-model keys)."""

import argparse
import difflib
import functools
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


@functools.cache
def _hybrid_model_keys() -> tuple[str, frozenset[str]]:
    """pretrain_mamba.py's name and the dests of its hybrid-model flags (``hybrid_arguments``;
    imported here, on an error's path: building a config must not import torch)."""
    from megatron.varlen_training import hybrid_arguments

    parser = argparse.ArgumentParser(add_help=False)
    hybrid_arguments.add_hybrid_args(parser)
    return hybrid_arguments.PROG, frozenset(vars(parser.parse_args([])))


def hybrid_model_hint(name: str) -> str:
    """For a key of pretrain_mamba.py's hybrid model (which the facade does not build: its
    model is the GPT of pretrain_gpt.py), the hint that says so; otherwise an empty string
    (a closest-name hint would point at an unrelated flag)."""
    prog, keys = _hybrid_model_keys()
    if name not in keys:
        return ""
    return (f"; it is {prog}'s hybrid-model flag: megatron.wrap trains pretrain_gpt.py's GPT "
            f"models (dense or MoE), train a hybrid Mamba model with {prog}")
