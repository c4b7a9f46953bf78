"""Errors that only reading a sample shows stop every rank at the same step, in one line.

A sample is read (tokenized, parsed, taken from a memory-mapped file) by the ranks that train
on it, when its step comes: a conversation the chat template refuses, text the tokenizer
refuses, a Parquet/Arrow row tokenized lazily, an indexed file read without a memory map
(``--no-mmap-bin-files``) that became unreadable. Raised on one rank only, such an error
stopped that rank and left the others in the step's next collective until
``--distributed-timeout-minutes`` (or until torchrun's agent killed them).

:func:`read_agreed` reads on every rank, then one MIN all-reduce of one integer over the world
says whether a rank failed and which was first. That collective is an addition: the step's own
exchanges do not span the world (the packed path gathers lengths over DP, then reroutes over
DP x CP; the unpacked path reduces length sums over DP; the TP/PP schedule check runs after the
reroute, which already needs every rank's samples). It costs one latency-bound all-reduce of 8
bytes per step and per evaluation batch (measured in docs/ARCHITECTURE.md, "Data errors read
mid-run"). Only when a rank failed do the ranks exchange the error
(:func:`errors.agree_on_errors`): a user error (ValueError, OSError, the one-line classes) is
raised on every rank, exit code 2, printed once by the first rank that read a bad sample; a
bug keeps its traceback on its rank, the others stop with :class:`errors.PeerRankError`.

Data whose reads cannot raise skips the all-reduce (:func:`reads_can_fail`): mock samples are
a pure function of the seed and the index, and memory-mapped indexed data is read from memory
(an I/O error under a memory map is a SIGBUS that ends the process, which no agreement can
report). Every rank decides from the same flags, so all skip it or none does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, TypeVar

import torch

from megatron.varlen.platform import get_device
from megatron.varlen_training.config.data import DataConfig
from megatron.varlen_training.errors import (
    ONE_LINE_ERRORS, START_UP_USER_ERRORS, PeerRankError, agree_on_errors,
)
from megatron.varlen_training.log import is_multi_rank

T = TypeVar("T")
# What a read raises for a bad sample (its message is the user's line); anything else is a bug.
READ_USER_ERRORS = ONE_LINE_ERRORS + START_UP_USER_ERRORS


def reads_can_fail(data: DataConfig) -> bool:
    """Whether reading a sample of the run's data can raise on one rank, so that a step's reads
    need :func:`read_agreed`. Decided from the data flags alone (every rank has the same), so
    the ranks agree on it without a collective.

    - mock data (``--mock-data``, with or without ``--sft``): never -- a sample is computed;
    - SFT files (JSONL, Parquet/Arrow): yes -- rows are tokenized (chat template, tokenizer)
      when read;
    - Megatron indexed data: only with ``--no-mmap-bin-files``, where every read opens the
      ``.bin`` (a file gone or unreadable on one node raises there); memory-mapped reads raise
      nothing.
    """
    if data.mock_data:
        return False
    if data.sft:
        return True
    return not data.mmap_bin_files


def read_agreed(read: Callable[[], T]) -> T:
    """``read()`` on every rank; if it raised on any rank, every rank raises (module docstring).

    Must be called by every rank of the world at the same point of the step.
    """
    if not is_multi_rank():
        return read()
    try:
        result, failure = read(), None
    except Exception as err:  # noqa: BLE001 -- shared with every rank below, then raised
        result, failure = None, err
    reader = first_failed_read(failure)
    if reader is None:
        return result
    try:
        agree_on_errors(_reraise, failure)
    except PeerRankError:
        raise  # a bug: printed by a rank without one, the bug's rank shows its traceback
    except Exception as err:
        if err is not failure and reader.user_error:
            err.reporting_rank = reader.rank  # printed once, by the rank that read the sample
        raise
    raise AssertionError("agree_on_errors returned although a rank's read failed")


def _reraise(failure: Exception | None) -> None:
    if failure is not None:
        raise failure


class FailedRead(NamedTuple):
    """The rank that prints: the lowest whose read raised a user error, else the lowest bug's."""

    rank: int
    user_error: bool


def first_failed_read(failure: Exception | None) -> FailedRead | None:
    """Who failed first, user errors before bugs; None if no rank did. Every rank calls it
    with its own read's exception (None: a good read); one MIN all-reduce over the world of
    ``rank`` for a user error, ``world + rank`` for a bug, ``2 x world`` for a good read."""
    world, rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
    bugs_from, nobody = world, 2 * world  # the code ranges: user errors, bugs, no failure
    if failure is None:
        mine = nobody
    else:
        mine = rank if isinstance(failure, READ_USER_ERRORS) else bugs_from + rank
    first = torch.tensor([mine], dtype=torch.int64, device=get_device())  # NCCL: on the device
    torch.distributed.all_reduce(first, op=torch.distributed.ReduceOp.MIN)
    value = int(first.item())
    if value == nobody:
        return None
    return FailedRead(value % world, value < bugs_from)
