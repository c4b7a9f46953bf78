"""The one logging style of both entry points (``pretrain_gpt.py``'s loop and ``MegatronWrap``).

Every line is ``<prefix> <LEVEL> <message>``, the prefix naming the rank and its parallel
coordinates::

    [rank 3 | tp 1 pp 0 dp 1 cp 0] INFO  [2026-11-27 02:42:07.123456] iteration        2/ ...

The message after the level is Megatron-LM's own line, character for character (its iteration
line with its timestamp, its validation line), so what users grep for is unchanged. Lines go
through the stdlib logger hierarchy under ``"megatron"`` (``logging.getLogger("megatron")`` sets
the level of all of them; ``get_logger(__name__)`` gives a module its child logger with the same
format) to the current ``sys.stdout``.

Which rank speaks follows Megatron-LM: ``print_rank_0`` (start-up facts, global rank 0),
``print_rank_last`` (the iteration and validation lines: the last rank owns the loss), the
``*_all_ranks`` helpers for facts that differ per rank. One-line user errors are not logged
here: ``errors.print_error_line`` prints them to stderr, once.

The coordinates come from a provider (``set_coordinates_provider``, the facade installs one);
without one from torch.distributed and megatron-core's parallel_state when they are initialised,
else from the ``RANK`` environment variable (torchrun sets it before any process group exists).
Nothing here imports torch. Importing this module installs the handler on the "megatron" logger.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import logging
import os
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

LOGGER_NAME = "megatron"
ENGINE_LOGGER_NAME = "megatron.core"
ENGINE_LOG_LEVEL = logging.WARNING
"""megatron-core logs its configs and gradient buckets at INFO: kept out of the training log
unless asked for (``logging.getLogger("megatron.core").setLevel("INFO")``)."""
RANK_ENV_VAR = "RANK"
WORLD_SIZE_ENV_VAR = "WORLD_SIZE"
COORDINATE_NAMES = ("tp", "pp", "dp", "cp")
"""Parallel coordinates shown after the rank, in this order (others follow as given)."""

CoordinatesProvider = Callable[[], Mapping[str, int]]
"""Returns ``{"rank": r, "tp": .., "pp": .., "dp": .., "cp": ..}``; only "rank" is required."""

_coordinates_provider: CoordinatesProvider | None = None


# --- coordinates and prefix ----------------------------------------------------------------


def set_coordinates_provider(provider: CoordinatesProvider | None) -> None:
    """Installs the function that tells each log line its rank and coordinates (None: default)."""
    global _coordinates_provider
    _coordinates_provider = provider


def get_coordinates() -> dict[str, int]:
    """This process's rank and parallel coordinates (see ``CoordinatesProvider``)."""
    if _coordinates_provider is not None:
        return dict(_coordinates_provider())
    coordinates = {"rank": _default_rank()}
    coordinates.update(_megatron_coordinates())
    return coordinates


def get_rank() -> int:
    """The global rank used for rank filtering."""
    return int(get_coordinates()["rank"])


def get_world_size() -> int:
    """The number of ranks (1 without a process group or torchrun)."""
    distributed = _initialized_distributed()
    if distributed is not None:
        return distributed.get_world_size()
    return int(os.environ.get(WORLD_SIZE_ENV_VAR, "1"))


def is_multi_rank() -> bool:
    """torch.distributed is initialised with more than one rank: a collective is needed to agree
    (and a rank that skips one leaves its peers waiting). Unlike :func:`get_world_size`, never
    the ``WORLD_SIZE`` of a process group that does not exist yet: no collective can run then."""
    distributed = _initialized_distributed()
    return distributed is not None and distributed.get_world_size() > 1


def is_last_rank() -> bool:
    """Megatron-LM's logging rank for losses: the last rank is on the last pipeline stage."""
    return get_rank() == get_world_size() - 1


def format_prefix(coordinates: Mapping[str, int]) -> str:
    """``[rank 3 | tp 1 pp 0 dp 1 cp 0]``, or ``[rank 3]`` without parallel coordinates."""
    names = [name for name in COORDINATE_NAMES if name in coordinates]
    names += [name for name in coordinates if name not in COORDINATE_NAMES and name != "rank"]
    parallel = " ".join(f"{name} {coordinates[name]}" for name in names)
    rank = f"rank {coordinates['rank']}"
    return f"[{rank} | {parallel}]" if parallel else f"[{rank}]"


def _initialized_distributed():
    torch = sys.modules.get("torch")  # not imported means no process group: never import it
    distributed = getattr(torch, "distributed", None)
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        return distributed
    return None


def _default_rank() -> int:
    distributed = _initialized_distributed()
    if distributed is not None:
        return distributed.get_rank()
    return int(os.environ.get(RANK_ENV_VAR, "0"))


def _megatron_coordinates() -> dict[str, int]:
    parallel_state = sys.modules.get("megatron.core.parallel_state")
    if parallel_state is None or not parallel_state.model_parallel_is_initialized():
        return {}
    return {
        "tp": parallel_state.get_tensor_model_parallel_rank(),
        "pp": parallel_state.get_pipeline_model_parallel_rank(),
        "dp": parallel_state.get_data_parallel_rank(),
        "cp": parallel_state.get_context_parallel_rank(),
    }


# --- the logger hierarchy --------------------------------------------------------------------


class RankFormatter(logging.Formatter):
    """``<prefix> <LEVEL> <line>`` for every line of the message (a traceback included)."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        head = f"{format_prefix(get_coordinates())} {record.levelname}"
        return "\n".join(f"{head} {line}" for line in text.split("\n"))


class _StdoutHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stdout`` is when a record is emitted (so redirection works)."""

    def __init__(self):
        super().__init__()
        self.setFormatter(RankFormatter("%(message)s"))

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, _value):
        pass  # always the current sys.stdout


def get_logger(name: str = LOGGER_NAME) -> logging.Logger:
    """The logger ``name`` (``__name__`` of a module under megatron/), writing through the
    ``"megatron"`` logger's handler: stdout, the rank prefix, INFO unless configured."""
    root = logging.getLogger(LOGGER_NAME)
    if not any(isinstance(handler, _StdoutHandler) for handler in root.handlers):
        root.addHandler(_StdoutHandler())
        root.propagate = False  # our lines are complete; the root logger would repeat them
        if root.level == logging.NOTSET:
            root.setLevel(logging.INFO)
        engine = logging.getLogger(ENGINE_LOGGER_NAME)
        if engine.level == logging.NOTSET:
            engine.setLevel(ENGINE_LOG_LEVEL)
    return logging.getLogger(name)


def set_log_level(level: str | int) -> None:
    """Sets the level of every megatron logger, e.g. "DEBUG" or ``logging.WARNING``."""
    get_logger().setLevel(level.upper() if isinstance(level, str) else level)


def set_process_log_level(level: int) -> None:
    """Megatron-LM's ``--logging-level``: the root logger's level, which library loggers follow.
    megatron-core's logger has a level of its own here (:data:`ENGINE_LOG_LEVEL`), so it is set
    too; the training log's own lines -- Megatron-LM prints them, whatever the level -- keep
    INFO unless the level asks for more detail."""
    logging.getLogger().setLevel(level)
    logging.getLogger(ENGINE_LOGGER_NAME).setLevel(level)
    set_log_level(min(level, logging.INFO))


@dataclasses.dataclass(frozen=True)
class _DropLinesStartingWith:
    """A logging filter; equal filters are one (``Logger.addFilter`` adds a filter once)."""

    prefix: str

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


def drop_foreign_log_lines(logger_name: str, prefix: str) -> None:
    """Drops another library's log lines whose message (before formatting) starts with
    ``prefix`` from its logger ``logger_name``; its other lines still show. Works before the
    library creates the logger (it gets the same object); idempotent."""
    logging.getLogger(logger_name).addFilter(_DropLinesStartingWith(prefix))


def _log(level: int, message: object, values: tuple,
         only_rank: Callable[[], bool] | None) -> None:
    """Logs ``message % values`` (as the stdlib does) if ``only_rank`` allows this rank; values
    that ``message`` does not format are joined to it with spaces, as ``print`` would (the
    stdlib would print a logging traceback and lose the line)."""
    if only_rank is not None and not only_rank():
        return
    get_logger().log(level, "%s", _format(message, values))


def _format(message: object, values: tuple) -> str:
    if not values:  # taken as it is: "100% done" is not a format string
        return str(message)
    if isinstance(message, str) and "%" in message:
        try:
            return message % values
        except (TypeError, ValueError):  # not a format string for these values
            pass
    return " ".join(str(part) for part in (message, *values))


def _is_rank_0() -> bool:
    return get_rank() == 0


# --- Megatron-LM's helpers -------------------------------------------------------------------


def print_rank_0(message: object, *args: object) -> None:
    """INFO on global rank 0 only (Megatron-LM's ``print_rank_0``)."""
    _log(logging.INFO, message, args, _is_rank_0)


def print_rank_last(message: object, *args: object) -> None:
    """INFO on the last rank only, which owns the loss (Megatron-LM's ``print_rank_last``)."""
    _log(logging.INFO, message, args, is_last_rank)


info_rank_0 = print_rank_0  # the name megatron.wrap and its examples used: the same function


def debug_rank_0(message: object, *args: object) -> None:
    """DEBUG on global rank 0 only."""
    _log(logging.DEBUG, message, args, _is_rank_0)


def warning_rank_0(message: object, *args: object) -> None:
    """WARNING on global rank 0 only (a fact every rank shares, e.g. a deprecated flag)."""
    _log(logging.WARNING, message, args, _is_rank_0)


def info_all_ranks(message: object, *args: object) -> None:
    """INFO on every rank (the prefix tells them apart)."""
    _log(logging.INFO, message, args, None)


def warning_all_ranks(message: object, *args: object) -> None:
    """WARNING on every rank."""
    _log(logging.WARNING, message, args, None)


def error_all_ranks(message: object, *args: object) -> None:
    """ERROR on every rank."""
    _log(logging.ERROR, message, args, None)


# --- capturing print() and warnings --------------------------------------------------------


@contextlib.contextmanager
def capture_print(rank_0_only: bool = False) -> Iterator[None]:
    """Routes ``print()`` to stdout through the logger (INFO) until exit, then restores it.

    For user code (a facade flow) that prints. Prints to another file (e.g.
    ``file=sys.stderr``) pass through unchanged. Each call is one log record, so ``end=""``
    fragments are not joined.

    Args:
        rank_0_only: Drop prints of ranks other than 0.
    """
    original = builtins.print

    def routed_print(*values: object, sep: str | None = " ", end: str | None = "\n",
                     file: Any = None, flush: bool = False) -> None:
        if file is not None and file is not sys.stdout:
            original(*values, sep=sep, end=end, file=file, flush=flush)
            return
        text = (" " if sep is None else sep).join(map(str, values))
        text += "\n" if end is None else end
        _log(logging.INFO, text.removesuffix("\n"), (), _is_rank_0 if rank_0_only else None)

    builtins.print = routed_print
    try:
        yield
    finally:
        builtins.print = original


@contextlib.contextmanager
def capture_warnings() -> Iterator[None]:
    """Routes shown warnings through the logger (WARNING, the rank's prefix) until exit.

    Both entry points enter it once, for the whole run. Warnings shown to an explicit file pass
    through unchanged; the warnings filters still decide which are shown (by default each
    warning once per code location, not once per iteration).
    """
    original = warnings.showwarning

    def routed_showwarning(message: Warning | str, category: type[Warning], filename: str,
                           lineno: int, file: Any = None, line: str | None = None) -> None:
        if file is not None:
            original(message, category, filename, lineno, file, line)
            return
        text = f"{category.__name__}: {message} ({filename}:{lineno})"
        _log(logging.WARNING, text, (), None)

    warnings.showwarning = routed_showwarning
    try:
        yield
    finally:
        warnings.showwarning = original


get_logger()  # from import on, every megatron.* logger (megatron-core's too) writes our lines
