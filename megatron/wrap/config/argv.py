"""Turning a flat config into command-line flags: the pretrain_gpt.py command line that runs the
same configuration (tests compare the two entry points on it; a user can launch it).

`flat_config_to_argv(config.flat, build_parser())` gives flags that `parse_args(argv)` accepts.
The facade itself does not go through a command line: it builds its run from the values
(`megatron.varlen_training.flag_values`), with the same checks and validation.
"""

import argparse
import json
from collections.abc import Mapping
from typing import Any

from megatron.varlen_training.list_valued_flags import LIST_VALUED
from megatron.wrap.config.errors import ConfigError, did_you_mean


def flat_config_to_argv(flat: Mapping[str, Any], parser: argparse.ArgumentParser) -> list[str]:
    """Returns the flags that set each key of `flat` through `parser`.

    - None: omitted (the parser default applies).
    - Flags without a value (store_true/store_false/store_const): the flag whose stored
      constant equals the value; nothing if the value is the parser default already.
    - `BooleanOptionalAction`: `--x` or `--no-x`.
    - `nargs` of '+', '*' or a number: `--x v1 v2 ...` (a scalar counts as a one-item list).
    - `action='append'`: `--x=v1 --x=v2 ...`.
    - Anything else: `--x=value` (so negative numbers are values); mappings and lists become
      JSON, floats keep full precision.

    Args:
        flat: CLI key (argparse dest) -> value.
        parser: The parser that will parse the result.

    Raises:
        ConfigError: A key is not a dest of `parser`, or its value cannot be expressed.
    """
    actions = _actions_by_dest(parser)
    argv: list[str] = []
    for key, value in flat.items():
        if value is None:
            continue
        if key not in actions:
            hint = did_you_mean(key, actions)
            raise ConfigError(f"'{key}' is not an argument of the parser{hint}")
        argv += _flags_for(key, value, actions[key], parser.get_default(key))
    return argv


def _actions_by_dest(parser: argparse.ArgumentParser) -> dict[str, list[argparse.Action]]:
    actions: dict[str, list[argparse.Action]] = {}
    for action in parser._actions:  # argparse has no public accessor for its actions
        if action.option_strings and action.default is not argparse.SUPPRESS:
            actions.setdefault(action.dest, []).append(action)
    return actions


def _flags_for(key: str, value: Any, actions: list[argparse.Action], default: Any) -> list[str]:
    action = actions[0]
    if isinstance(action, argparse.BooleanOptionalAction):
        return [_boolean_optional_flag(key, value, action)]
    if action.nargs == 0:
        return _constant_flag(key, value, actions, default)
    option = _option(action)
    if isinstance(action, argparse._AppendAction):  # no public name for action='append'
        return [f"{option}={_format(item)}" for item in _as_list(value)]
    if action.nargs in ("+", "*") or isinstance(action.nargs, int):
        return [option, *(_format(item) for item in _as_list(value))]
    if isinstance(value, (list, tuple)) and key not in LIST_VALUED:
        raise ConfigError(f"'{key}' takes one value, got the list {value!r}")
    return [f"{option}={_format(value)}"]


def _constant_flag(key: str, value: Any, actions: list[argparse.Action], default: Any) -> list[str]:
    """Picks the value-less flag that stores `value` (e.g. store_true for True)."""
    if _same(value, default):
        return []
    for action in actions:
        if action.nargs == 0 and _same(value, action.const):
            return [_option(action)]
    flags = ", ".join(option for action in actions for option in action.option_strings)
    raise ConfigError(f"cannot set '{key}' to {value!r}: no flag stores that value ({flags})")


def _boolean_optional_flag(key: str, value: Any, action: argparse.Action) -> str:
    if not isinstance(value, bool):
        raise ConfigError(f"'{key}' must be true or false, got {value!r}")
    negative = [option for option in action.option_strings if option.startswith("--no-")]
    positive = [option for option in action.option_strings if option not in negative]
    return positive[0] if value else negative[0]


def _same(value: Any, constant: Any) -> bool:
    """Equality that keeps True apart from 1 (store_const of an int vs a boolean flag)."""
    return type(value) is type(constant) and value == constant


def _option(action: argparse.Action) -> str:
    """Returns `--dest-with-dashes` if the action has it, else its first long option."""
    preferred = "--" + action.dest.replace("_", "-")
    if preferred in action.option_strings:
        return preferred
    long_options = [option for option in action.option_strings if option.startswith("--")]
    return (long_options or action.option_strings)[0]


def _as_list(value: Any) -> list:
    return value if isinstance(value, (list, tuple)) else [value]


def _format(value: Any) -> str:
    if isinstance(value, (Mapping, list, tuple)):
        return json.dumps(value)
    return repr(value) if isinstance(value, float) else str(value)
