"""Writes tests/unit_tests/data/megatron_lm_flags.txt (every option string of Megatron-LM's
training parser) and megatron_lm_switches.txt (those that take no value), read by running that
parser from a Megatron-LM checkout.

    python tools/megatron_lm_flags.py --megatron-lm /path/to/Megatron-LM [--commit-note TEXT]

The checkout's ``megatron.training.arguments.parse_args`` builds its parser and parses; this
tool stops it at the parse and lists the option strings of the parser it built (sorted, one a
line, under a header naming the source). Triton is not needed: where it is missing, a stand-in
module answers every attribute, since the parser never runs a kernel. Megatron-LM is read, not
copied. tests/unit_tests/varlen_training/test_megatron_lm_flag_census.py reads the list.
"""

from __future__ import annotations

if not __package__:  # run as `python tools/X.py`: the repository root on sys.path
    import _repo_root  # noqa: F401

import argparse
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import typing
import warnings
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parents[1]
OUTPUT = REPO / "tests" / "unit_tests" / "data" / "megatron_lm_flags.txt"
SWITCHES_OUTPUT = OUTPUT.with_name("megatron_lm_switches.txt")
STAND_IN_PACKAGES = ("triton",)  # imported by megatron.core at import time, never run here
# What the stand-in answers for ``__version__``: megatron.core compares Triton's version.
STAND_IN_VERSION = "3.6.0"


class _StandInModule(types.ModuleType):
    """A module whose every public attribute is a mock (a class where the name is one)."""

    def __getattr__(self, name: str):
        if name == "__version__":
            return STAND_IN_VERSION
        if name.startswith("__"):
            raise AttributeError(name)
        if name[:1].isupper():
            return type(name, (), {"__init__": lambda self, *a, **k: None,
                                   "__call__": lambda self, *a, **k: mock.MagicMock()})
        return mock.MagicMock()


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in STAND_IN_PACKAGES:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StandInModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


class _Stop(Exception):
    """Raised from the patched parse: the parser is built, nothing else is wanted."""


def megatron_lm_parser(checkout: Path) -> argparse.ArgumentParser:
    """``checkout``'s training parser, as its parse_args builds it."""
    # The checkout's megatron package first: its megatron.training beside its own megatron.core.
    sys.path.insert(0, str(checkout))
    if any(importlib.util.find_spec(name) is None for name in STAND_IN_PACKAGES):
        sys.meta_path.insert(0, _StandInFinder())
    if not hasattr(typing, "override"):  # Python < 3.12: main imports it; a decorator only
        typing.override = lambda function: function
    warnings.simplefilter("ignore")
    from megatron.training import arguments  # noqa: PLC0415 - the checkout's, once on the path

    built = {}

    def capture(parser, *args, **kwargs):
        built["parser"] = parser
        raise _Stop

    argv, sys.argv = sys.argv, [sys.argv[0]]
    try:
        with mock.patch.object(argparse.ArgumentParser, "parse_args", capture), \
                mock.patch.object(argparse.ArgumentParser, "parse_known_args", capture):
            arguments.parse_args()
    except _Stop:
        pass
    finally:
        sys.argv = argv
    return built["parser"]


def option_strings(parser: argparse.ArgumentParser, switches_only: bool = False) -> list[str]:
    """The sorted ``--`` option strings of ``parser`` (with ``switches_only``: of the actions
    that take no value)."""
    return sorted({option for action in parser._actions  # argparse keeps them private
                   if not switches_only or action.nargs == 0
                   for option in action.option_strings if option.startswith("--")})


def _write(path: Path, what: str, source: str, flags: list[str]) -> None:
    header = [f"# Megatron-LM's {what} (megatron.training.arguments' parser),",
              f"# written by tools/megatron_lm_flags.py{source}; read by "
              f"test_megatron_lm_flag_census.py."]
    path.write_text("\n".join(header + flags) + "\n")
    print(f"{len(flags)} flags -> {path}")


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--megatron-lm", type=Path, required=True,
                     help="a Megatron-LM checkout (its megatron/training/arguments.py)")
    cli.add_argument("--commit-note", default="",
                     help="what the header says about the checkout (e.g. its commit)")
    cli.add_argument("--output", type=Path, default=OUTPUT)
    cli.add_argument("--switches-output", type=Path, default=SWITCHES_OUTPUT)
    options = cli.parse_args()
    parser = megatron_lm_parser(options.megatron_lm.resolve())
    source = f" from {options.commit_note}" if options.commit_note else ""
    _write(options.output, "training flags (every option string)", source,
           option_strings(parser))
    _write(options.switches_output, "switches (the flags that take no value)", source,
           option_strings(parser, switches_only=True))


if __name__ == "__main__":
    main()
