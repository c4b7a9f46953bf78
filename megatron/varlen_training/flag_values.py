"""Flag values given as data (a ``megatron.wrap`` config tree) -> the validated namespace that
pretrain_gpt.py's command line would give, without writing a command line.

Each value is checked against its flag's action (``MegatronArgumentParser.flag_actions``) as
argparse checks a typed word of the command line: its type, its choices, how many values it
takes, which constants a value-less flag stores; then ``--hf-checkpoint``'s defaults, the
required flags and the one validation path (:func:`arguments.validate_args`) follow, as in
:func:`arguments.parse_args`. YAML values are typed already: ``64`` is an int, ``1e-4`` a float,
``true`` a bool; a mapping or list given to a flag that takes text is written as JSON (e.g.
``sft_mock_dataset_config_json``). Every error is the one-line ArgumentValidationError.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

from megatron.varlen_training import checkpoint_model_flags
from megatron.varlen_training.arguments import build_parser, validate_args
from megatron.varlen_training.flag_errors import ArgumentValidationError, require
from megatron.varlen_training.hf import arguments as hf_arguments
from megatron.varlen_training.list_valued_flags import LIST_VALUED

MANY_VALUES = ("+", "*")  # argparse's nargs for a list of values


def _actions_by_dest(parser) -> dict[str, list[argparse.Action]]:
    actions: dict[str, list[argparse.Action]] = {}
    for action in parser.flag_actions:
        if action.option_strings and action.default is not argparse.SUPPRESS:
            actions.setdefault(action.dest, []).append(action)
    return actions


def _flag(action: argparse.Action) -> str:
    return "/".join(action.option_strings)


def same_value(value: Any, constant: Any) -> bool:
    """Equality that keeps True apart from 1 (store_const of an int vs a boolean flag)."""
    return type(value) is type(constant) and value == constant


def _stored_constant(dest: str, value: Any, actions: list[argparse.Action], default: Any) -> Any:
    """A value-less flag (store_true, store_false, store_const): ``value`` must be what one of
    them stores, or the default."""
    if isinstance(actions[0], argparse.BooleanOptionalAction):
        require(isinstance(value, bool), f"argument {_flag(actions[0])}: expected true or "
                                         f"false, got {value!r} (config key {dest!r})")
        return value
    if same_value(value, default) or any(same_value(value, action.const) for action in actions):
        return value
    flags = ", ".join(_flag(action) for action in actions)
    raise ArgumentValidationError(f"cannot set {dest!r} to {value!r}: no flag stores that value "
                                  f"({flags})")


def _text(value: Any) -> str:
    """A value for a flag that takes text: mappings and lists as JSON, floats exactly."""
    if isinstance(value, (Mapping, list, tuple)):
        return json.dumps(value)
    return repr(value) if isinstance(value, float) else str(value)


def _converted(dest: str, value: Any, kind) -> Any:
    """``value`` as ``kind`` (the flag's ``type``) reads it: a bool is never a number, a float
    never an int (argparse refuses the text ``2.5`` for an int flag too)."""
    where = f"invalid {kind.__name__} value: {value!r} (config key {dest!r})"
    require(not isinstance(value, bool), where)
    if kind is int:
        require(isinstance(value, (int, str)), where)
    elif kind is float:
        require(isinstance(value, (int, float, str)), where)
    try:
        return kind(value)
    except argparse.ArgumentTypeError as err:  # a type function's own one-line message
        raise ArgumentValidationError(f"{err} (config key {dest!r})") from None
    except (TypeError, ValueError):
        raise ArgumentValidationError(where) from None


def _typed(dest: str, value: Any, action: argparse.Action) -> Any:
    """One value as the flag reads it (argparse's conversion and choices, for typed data)."""
    try:
        typed = _text(value) if action.type is None else _converted(dest, value, action.type)
    except ArgumentValidationError as err:
        raise ArgumentValidationError(f"argument {_flag(action)}: {err}") from None
    if action.choices is not None and typed not in action.choices:
        choices = ", ".join(map(str, action.choices))
        raise ArgumentValidationError(f"argument {_flag(action)}: invalid choice: {typed!r} "
                                      f"(choose from {choices}; config key {dest!r})")
    return typed


def _stored(dest: str, value: Any, actions: list[argparse.Action], default: Any) -> Any:
    """What the parser would store for ``value`` given to flag ``dest``."""
    action = actions[0]
    if action.nargs == 0:
        return _stored_constant(dest, value, actions, default)
    if action.nargs in MANY_VALUES or isinstance(action.nargs, int):
        items = list(value) if isinstance(value, (list, tuple)) else [value]
        count_ok = len(items) == action.nargs if isinstance(action.nargs, int) else \
            (bool(items) or action.nargs == "*")
        require(count_ok, f"argument {_flag(action)}: expected {action.nargs} value(s), got "
                          f"{len(items)} (config key {dest!r})")
        return [_typed(dest, item, action) for item in items]
    require(not isinstance(value, (list, tuple)) or dest in LIST_VALUED,
            f"argument {_flag(action)}: takes one value, got the list {value!r} "
            f"(config key {dest!r})")
    return _typed(dest, value, action)


def _namespace(parser, values: Mapping[str, Any]) -> argparse.Namespace:
    """The parser's defaults, overridden by ``values`` (None: leave the default)."""
    actions = _actions_by_dest(parser)
    unknown = sorted(set(values) - set(actions))
    require(not unknown, f"unrecognized arguments: {', '.join(unknown)}")
    missing = [_flag(action) for action in parser.flag_actions
               if action.required and values.get(action.dest) is None]
    require(not missing, f"the following arguments are required: {', '.join(missing)}")
    defaults = parser.defaults()
    args = argparse.Namespace(**{dest: defaults.get(dest) for dest in actions})
    for dest, value in values.items():
        if value is not None:
            setattr(args, dest, _stored(dest, value, actions[dest], defaults.get(dest)))
    return args


def parse_values(values: Mapping[str, Any], world_size: int | None = None,
                 prog: str = "pretrain_gpt.py") -> argparse.Namespace:
    """What :func:`arguments.parse_args` gives for the command line that sets ``values``
    (argparse dest -> value): parsed, ``--hf-checkpoint`` applied, validated.

    Raises:
        ArgumentValidationError: A bad value or combination (one line).
    """
    parser = build_parser(prog)
    try:  # --hf-checkpoint: the checkpoint's architecture as defaults, checked for conflicts
        fixed = hf_arguments.apply_checkpoint_defaults(parser, values.get("hf_checkpoint"))
        taken = checkpoint_model_flags.read_checkpoint_flags(
            checkpoint_model_flags.load_flags_of(values))  # use_checkpoint_args
        checkpoint_model_flags.apply_as_defaults(parser, taken)
        args = _namespace(parser, values)
        checkpoint_model_flags.override_command_line(args, taken)
        hf_arguments.check_conflicts(parser, args, fixed)
    except ArgumentValidationError:
        raise
    except ValueError as err:  # HFConfigError: one line, like every argument error
        raise ArgumentValidationError(str(err)) from err
    args.world_size = world_size
    return validate_args(args)
