"""Megatron-LM flags registered only to be refused: a Megatron-LM command line carrying one gets
a line naming the flag and why (exit 2) instead of argparse's "unrecognized arguments", or a
silent no-op. Each table maps a flag to ``(argparse keywords, neutral, why)``: ``neutral`` is
Megatron-LM's default as given on a command line (the value that changes nothing, accepted), or
None when only leaving the flag out changes nothing.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Mapping

RefusedFlags = Mapping[str, tuple[dict, "str | None", str]]
# (flag, argparse keywords, Megatron-LM's default): tuning flags of a refused feature.
UnreadFlags = tuple[tuple[str, dict, object], ...]


def dest_of(flag: str, kwargs: dict) -> str:
    """The namespace attribute of ``flag`` (its ``dest`` keyword, else argparse's own)."""
    return kwargs.get("dest") or flag[2:].replace("-", "_")


def add_refused_flags(group, table: RefusedFlags, skip: tuple[str, ...] = (),
                      neutral_default: bool = False) -> None:
    """Registers the flags of ``table`` (but those in ``skip``) on ``group``, their help saying
    why each is refused. A switch defaults to False; another flag to None, or with
    ``neutral_default`` to its neutral value (typed), so a view that lists Megatron-LM's
    defaults (megatron.wrap's) sees the same value."""
    for flag, (kwargs, neutral, why) in table.items():
        if flag in skip:
            continue
        if kwargs.get("action") == "store_true":
            default = False
        elif neutral is None or not neutral_default:
            default = None
        else:
            default = kwargs.get("type", str)(neutral)
        neutral_note = "" if neutral is None else f" (but {neutral}, which changes nothing)"
        group.add_argument(flag, default=default, help=f"Refused{neutral_note}: {why}.",
                           **kwargs)


def add_unread_flags(group, flags: UnreadFlags, read_only_with: str) -> None:
    """Registers ``flags`` with Megatron-LM's defaults as accepted and without effect: Megatron-LM
    reads them only with ``read_only_with``, a feature refused here, so without it they change
    nothing there either (a recipe may carry them at any value)."""
    for flag, kwargs, default in flags:
        group.add_argument(flag, default=default,
                           help=f"Accepted, no effect: Megatron-LM reads it only with "
                                f"{read_only_with}, refused here.", **kwargs)


def given_refused_flags(args: argparse.Namespace, table: RefusedFlags,
                        skip: tuple[str, ...] = ()) -> Iterator[tuple[str, str, str]]:
    """``(flag, its value as given, why)`` for each flag of ``table`` (but those in ``skip``)
    whose value asks for something: set, and not its neutral value. The value is "" for a
    switch, else `` VALUE`` (a list joined by spaces), ready to follow the flag in a line."""
    for flag, (kwargs, neutral, why) in table.items():
        if flag in skip:
            continue
        value = getattr(args, dest_of(flag, kwargs))
        # By identity: a given 0 equals False, and is a value that asks for something.
        if value is None or value is False:
            continue
        shown = " ".join(map(str, value)) if isinstance(value, list) else str(value)
        if shown == neutral:
            continue
        yield flag, "" if value is True else f" {shown}", why
