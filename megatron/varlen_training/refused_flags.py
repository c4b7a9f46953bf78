"""Megatron-LM flags registered only to be refused in one line, or accepted without effect.

A Megatron-LM command line carrying one gets, instead of argparse's "unrecognized arguments"
or a silent no-op, either nothing (the flag changes nothing here) or a line naming the flag,
its value and why (exit 2). Every such flag is one :class:`FlagRow` of a table (a tuple of
rows) of the flag group that owns it (``*_arguments.py``, megatron_lm_census_flags.py,
tools/preprocess_data.py): registered by :func:`add_flag_rows`, checked by
:func:`refuse_given` (built on :func:`given_refused_flags`), its help in one format
(:meth:`FlagRow.help`). tests/unit_tests/varlen_training/test_refused_flags.py takes every row
from the parsers and checks each.

A refused row accepts its *neutral* values: Megatron-LM's default (``default``, also what the
parser holds when the flag is not given) and ``accepts``, further command-line values that ask
for nothing. A value counts as neutral when it prints the same (a list joined by spaces), or,
given as text for a row whose default is a number, when it is the same number
(``--cpu-offloading-num-layers 0.0`` is the default 0).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping

SWITCH: Mapping[str, object] = {"action": "store_true"}
REFUSED_HELP = "Refused"
ACCEPTED_HELP = "Accepted, no effect"
ROW_ATTRIBUTE = "flag_row"  # the argparse action of a registered row carries its row here


def dest_of(flag: str, kwargs: Mapping[str, object]) -> str:
    """The namespace attribute of ``flag`` (its ``dest`` keyword, else argparse's own)."""
    return kwargs.get("dest") or flag[2:].replace("-", "_")


@dataclasses.dataclass(frozen=True)
class FlagRow:
    """One Megatron-LM flag that is refused (unless neutral) or accepted without effect."""

    names: tuple[str, ...]
    """Option strings; the first names the flag in lines (the others are Megatron-LM's
    aliases, e.g. ``--disable-*`` beside ``--no-*``)."""
    kwargs: Mapping[str, object]
    """argparse keywords but ``default`` and ``help`` (action, type, choices, nargs, dest)."""
    default: object
    """The parser's value when the flag is not given: Megatron-LM's default, typed as its
    parser holds it (the megatron.wrap view lists it), or None."""
    why: str
    """Why it is refused, or why it changes nothing (the end of the line and of the help)."""
    refused: bool = True
    """False: accepted at any value, without effect."""
    accepts: tuple[object, ...] = ()
    """Command-line values beside ``default`` that ask for nothing (refused rows)."""
    note: str = ""
    """Appended to the help (e.g. which Megatron-LM release has the flag)."""

    @property
    def flag(self) -> str:
        return self.names[0]

    @property
    def dest(self) -> str:
        return dest_of(self.flag, self.kwargs)

    def neutral_values(self) -> list[object]:
        """The values a command line may give a refused row, shown in its help."""
        is_value = self.default is not None and not isinstance(self.default, bool)
        return [self.default] * is_value + list(self.accepts)

    def help(self) -> str:
        """``Refused (but N, which changes nothing): why.`` or ``Accepted, no effect: why.``"""
        neutral = [_shown_in_help(value) for value in self.neutral_values()]
        but = (f" (but {' or '.join(neutral)}, which changes nothing)"
               if self.refused and neutral else "")
        return f"{REFUSED_HELP if self.refused else ACCEPTED_HELP}{but}: {self.why}.{self.note}"

    def asks_for_nothing(self, value: object) -> bool:
        """Whether ``value`` (as parsed) leaves this flag neutral."""
        if value is None or value is self.default:
            return True
        if isinstance(value, bool) or isinstance(self.default, bool):
            # A switch asks for something unless at its default; type=bool's False (given
            # "") asks for nothing where the default is None.
            return value is False and self.default is None
        neutral = [candidate for candidate in (self.default, *self.accepts)
                   if candidate is not None]
        if _shown(value) in {_shown(candidate) for candidate in neutral}:
            return True
        return isinstance(value, str) and any(
            _same_number(value, candidate) for candidate in neutral
            if isinstance(candidate, (int, float)) and not isinstance(candidate, bool))


def accepted_rows(*rows: FlagRow) -> tuple[FlagRow, ...]:
    """``rows`` accepted at any value, without effect."""
    return tuple(dataclasses.replace(row, refused=False) for row in rows)


def read_only_with(feature: str) -> str:
    """The ``why`` of a tuning flag Megatron-LM reads only with ``feature``, refused here: it
    changes nothing there either without it, so it is accepted at any value."""
    return f"Megatron-LM reads it only with {feature}, refused here"


def with_notes(rows: Iterable[FlagRow], note_of: Callable[[FlagRow], str]) -> tuple[FlagRow, ...]:
    """``rows`` with ``note_of(row)`` appended to each help."""
    return tuple(dataclasses.replace(row, note=note_of(row)) for row in rows)


def add_flag_rows(group, rows: Iterable[FlagRow], skip: tuple[str, ...] = ()) -> None:
    """Registers ``rows`` (but the flags in ``skip``, which the caller registers itself) on
    ``group``, each help in the one format; each action carries its row."""
    for row in rows:
        if row.flag in skip:
            continue
        action = group.add_argument(*row.names, default=row.default, help=row.help(),
                                    **row.kwargs)
        setattr(action, ROW_ATTRIBUTE, row)


def registered_rows(parser: argparse.ArgumentParser) -> list[FlagRow]:
    """Every row registered on ``parser`` (by any flag group), in registration order."""
    return [getattr(action, ROW_ATTRIBUTE) for action in parser._actions
            if hasattr(action, ROW_ATTRIBUTE)]


def given_refused_flags(args: argparse.Namespace, rows: Iterable[FlagRow],
                        skip: tuple[str, ...] = ()) -> Iterator[tuple[str, str, str]]:
    """``(flag, its value as given, why)`` for each refused row (but those in ``skip``) whose
    value asks for something. The value is "" for a switch, else `` VALUE`` (a list joined by
    spaces), ready to follow the flag in a line."""
    for row in rows:
        if not row.refused or row.flag in skip:
            continue
        value = getattr(args, row.dest)
        if not row.asks_for_nothing(value):
            yield row.flag, "" if isinstance(value, bool) else f" {_shown(value)}", row.why


def refusal_line(flag: str, given: str, why: str) -> str:
    """The one line of a refused flag: ``--flag VALUE is not supported: why``."""
    return f"{flag}{given} is not supported: {why}"


def refuse_given(args: argparse.Namespace, rows: Iterable[FlagRow], require,
                 skip: tuple[str, ...] = ()) -> None:
    """Stops at the first refused flag of ``rows`` given a value that asks for something
    (``require(cond, message)``)."""
    for flag, given, why in given_refused_flags(args, rows, skip):
        require(False, refusal_line(flag, given, why))


def _shown(value: object) -> str:
    return " ".join(map(str, value)) if isinstance(value, list) else str(value)


def _shown_in_help(value: object) -> str:
    shown = _shown(value)
    return shown if shown else "''"  # an empty value stays visible


def _same_number(text: str, number: int | float) -> bool:
    try:
        return float(text) == float(number)
    except ValueError:
        return False
