"""Flows by name: the built-in ones and those users register (config key ``flow.flow_name``)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from megatron.wrap.config.errors import ConfigError, did_you_mean
from megatron.wrap.flows.base import (DATA_PATH_READS, IGNORED_FIELDS_KEY, Flow, FlowContext,
                                      check_flow_class)

FLOW_NAME_KEY = "flow.flow_name"
FLOW_ARGS_KEY = "flow.flow_args"

_FLOWS: dict[str, type[Flow]] = {}


def register_flow(name: str, flow_class: type[Flow] | None = None, *, replace: bool = False):
    """Registers ``flow_class`` under ``name``; also usable as a class decorator.

        @register_flow("reinforce")
        class ReinforceFlow(GPTFlow): ...

    Args:
        name: The value of ``flow.flow_name`` that selects the flow.
        flow_class: A :class:`Flow` subclass (omit to use as a decorator).
        replace: Allow replacing a flow already registered under ``name``.

    Raises:
        ValueError: ``name`` is taken (and ``replace`` is False) or the class is not a Flow.
        TypeError: The class uses megatron-wrap's method names (``check_flow_class``).
    """

    def register(cls: type[Flow]) -> type[Flow]:
        if not (isinstance(cls, type) and issubclass(cls, Flow)):
            raise ValueError(f"register_flow({name!r}): {cls!r} is not a Flow subclass")
        check_flow_class(cls)
        if name in _FLOWS and _FLOWS[name] is not cls and not replace:
            raise ValueError(f"a flow named {name!r} is already registered "
                             f"({_FLOWS[name].__qualname__}); pass replace=True to replace it")
        cls.name = name
        _FLOWS[name] = cls
        return cls

    return register if flow_class is None else register(flow_class)


def registered_flows() -> tuple[str, ...]:
    """Names of every registered flow, sorted."""
    return tuple(sorted(_FLOWS))


def get_flow_class(name: str) -> type[Flow]:
    """The flow class registered as ``name``.

    Raises:
        ConfigError: No such flow (a ValueError); names the registered ones and the closest.
    """
    if name not in _FLOWS:
        raise ConfigError(f"unknown flow {name!r} (config key {FLOW_NAME_KEY!r}); registered: "
                         f"{', '.join(registered_flows())}{did_you_mean(str(name), _FLOWS)}"
                         f" (register your own with megatron.wrap.register_flow)")
    return _FLOWS[name]


def build_flow(name: str, context: FlowContext, flow_args: Mapping[str, Any] | None) -> Flow:
    """Instantiates flow ``name`` with ``flow.flow_args``, checking them against ``__init__``.

    Raises:
        ConfigError: Unknown flow, or flow_args its ``__init__`` does not accept.
        TypeError: The class uses megatron-wrap's method names (``check_flow_class``).
    """
    flow_class = get_flow_class(name)
    check_flow_class(flow_class)  # also for a class given methods after it was registered
    missing = [method for method in ("collate_micro_batch", "loss")
               if getattr(flow_class, method) is getattr(Flow, method)]
    if missing:
        raise TypeError(f"flow {name!r} ({flow_class.__qualname__}) does not implement "
                        f"{' and '.join(missing)} (docs/WRAP.md section 3); subclass GPTFlow "
                        f"or GPTSFTFlow to inherit them")
    kwargs = dict(flow_args or {})
    try:
        inspect.signature(flow_class).bind(context, **kwargs)
    except TypeError as err:
        raise ConfigError(f"flow {name!r}: {FLOW_ARGS_KEY} {sorted(kwargs)} do not fit "
                         f"{flow_class.__qualname__}{inspect.signature(flow_class)}: {err}"
                         ) from None
    flow = flow_class(context, **kwargs)
    _check_ignored_fields(flow)
    return flow


def ignored_fields(names: Any) -> tuple[str, ...]:
    """Config key ``flow.ignored_fields`` as a tuple of field names.

    Raises:
        ConfigError: Not a list of strings.
    """
    if names is None:
        return ()
    bad = [name for name in names if not isinstance(name, str)] \
        if isinstance(names, (list, tuple)) else [names]
    if bad:
        raise ConfigError(f"config key {IGNORED_FIELDS_KEY!r} must be a list of sample field "
                          f"names, got {bad[0]!r}")
    return tuple(names)


def _check_ignored_fields(flow: Flow) -> None:
    """An ignored field that the flow reads would be read all the same: refused, so that
    nobody believes a field is left out of training while it is trained on."""
    ignored = (*flow.ignored_fields, *flow.context.ignored_fields)
    reads = (*DATA_PATH_READS, *flow.fields_and_seq_dims())
    read = [name for name in ignored if name in reads]
    if read:
        raise ConfigError(f"config key {IGNORED_FIELDS_KEY!r} (or the flow's ignored_fields) "
                          f"names {read[0]!r}, which flow {flow.name!r} reads (it reads "
                          f"{', '.join(dict.fromkeys(reads))}); remove it from the list")
