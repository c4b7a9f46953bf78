"""``megatron.wrap.logger``: megatron-wrap's logger methods on this fork's rank-aware log.

    from megatron.wrap import logger                    # this module
    logger.info_rank_0("loaded", n, "samples")          # -> "loaded | 12 | samples"
    logger.debug_all_ranks(f"shard {rank}")

Every ``(error|warning|info|debug)_(rank_0|all_ranks)`` takes one message or several values,
as megatron-wrap's did; lines go through ``megatron.varlen_training.log`` (prefix with the rank
and its parallel coordinates, level set by ``logging.log_level``). Several values are joined
with " | ", megatron-wrap's separator, and never %-formatted (``"100% done"`` stays as it is),
so a call never ends in a logging traceback that loses the message. (``log.print_rank_0`` and
friends keep the stdlib's %-style.)
"""

from __future__ import annotations

import logging

from megatron.varlen_training import log

SEPARATOR = " | "  # how megatron-wrap joined several values of one call
LEVELS = {"error": logging.ERROR, "warning": logging.WARNING, "info": logging.INFO,
          "debug": logging.DEBUG}


def format_message(message: object, *values: object) -> str:
    """Every part as text, joined by " | " (megatron-wrap's rule)."""
    return SEPARATOR.join(str(part) for part in (message, *values))


def _emit(level: str, rank_0_only: bool, message: object, values: tuple) -> None:
    if rank_0_only and log.get_rank() != 0:
        return
    log.get_logger().log(LEVELS[level], "%s", format_message(message, *values))


def error_rank_0(message: object, *values: object) -> None:
    """ERROR on global rank 0."""
    _emit("error", True, message, values)


def warning_rank_0(message: object, *values: object) -> None:
    """WARNING on global rank 0."""
    _emit("warning", True, message, values)


def info_rank_0(message: object, *values: object) -> None:
    """INFO on global rank 0."""
    _emit("info", True, message, values)


def debug_rank_0(message: object, *values: object) -> None:
    """DEBUG on global rank 0."""
    _emit("debug", True, message, values)


def error_all_ranks(message: object, *values: object) -> None:
    """ERROR on every rank."""
    _emit("error", False, message, values)


def warning_all_ranks(message: object, *values: object) -> None:
    """WARNING on every rank."""
    _emit("warning", False, message, values)


def info_all_ranks(message: object, *values: object) -> None:
    """INFO on every rank."""
    _emit("info", False, message, values)


def debug_all_ranks(message: object, *values: object) -> None:
    """DEBUG on every rank."""
    _emit("debug", False, message, values)


# loguru's plain names, which megatron-wrap's scripts also call: every rank
error, warning, info, debug = error_all_ranks, warning_all_ranks, info_all_ranks, debug_all_ranks
