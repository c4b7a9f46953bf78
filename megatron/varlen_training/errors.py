"""Errors a user can act on, and how entry points report them: one line, printed once.

Every error in this module is a complete, one-line message naming the file/line or flag, the
value and the limit. :func:`exit_on_user_errors` turns them into ``<prog>: error: <message>`` on
global rank 0 and the exit code below, on every rank, without a traceback. Anything else (a bug)
keeps its traceback.

Ranks must agree on failing, or a rank that did not fail waits in its next collective for
peers that have left: :func:`agree_on_errors` runs a start-up step on every rank and, if any
rank raised a user error, raises it on all of them (named by the first failing rank).
"""

from __future__ import annotations

import contextlib
import sys

import torch

from megatron.varlen.packing import InvalidScheduleError
from megatron.varlen_training.log import get_rank

USAGE_EXIT_CODE = 2  # bad flags or data (argparse's convention)
TRAINING_FAILED_EXIT_CODE = 1  # the run itself went wrong (non-finite loss, bad checkpoint)
INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT: how shells report a command stopped by Ctrl-C


class UserInputError(ValueError):
    """Bad data or a bad flag value found after argument parsing (exit code 2)."""

    exit_code = USAGE_EXIT_CODE


class CheckpointError(ValueError):
    """A checkpoint is missing, partial, corrupted, unsafe, or does not match the run."""

    exit_code = USAGE_EXIT_CODE


class NonFiniteLossError(RuntimeError):
    """A NaN/Inf loss or gradient norm stopped the run (``--check-for-nan-in-loss-and-grad``)."""

    exit_code = TRAINING_FAILED_EXIT_CODE


assert InvalidScheduleError.exit_code == TRAINING_FAILED_EXIT_CODE  # a bug: the run went wrong
ONE_LINE_ERRORS = (UserInputError, CheckpointError, NonFiniteLossError, InvalidScheduleError)
# How gloo/NCCL report a peer process that died (killed, crashed) inside a collective. Such an
# error is the echo of another rank's failure: one line per surviving rank, not a traceback.
PEER_LOST_MARKERS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
                     "NCCL communicator was aborted")
PEER_LOST_DETAIL_CHARS = 120


def one_line(message: str) -> str:
    """``message`` on one line (a wrapped upstream message must not break the contract)."""
    return " ".join(str(message).split())


def print_error_line(prog: str, message: object, every_rank: bool = False) -> None:
    """``<prog>: error: <message>`` on stderr, one line, on global rank 0 (every rank fails
    alike: printed once) or, with ``every_rank``, on each rank that calls it.

    The only place besides megatron/varlen_training/log.py that prints: a user error is not a log
    record (no rank prefix, no level), it is argparse's one line.
    """
    if every_rank or get_rank() == 0:
        print(f"{prog}: error: {one_line(message)}", file=sys.stderr, flush=True)


def flush_standard_streams() -> None:
    """Pushes out what the process printed (before an ``os._exit``, which skips it)."""
    sys.stdout.flush()
    sys.stderr.flush()


@contextlib.contextmanager
def exit_on_user_errors(prog: str):
    """Prints a :data:`ONE_LINE_ERRORS` error once (global rank 0) and exits with its code; a
    Ctrl-C (outside a save, which reports its own) ends in one line and exit code 130."""
    try:
        yield
    except ONE_LINE_ERRORS as err:
        print_error_line(prog, err)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        print_error_line(prog, "interrupted by Ctrl-C (SIGINT) during training: the iteration "
                         "in progress is lost, the latest checkpoint is intact (resume with "
                         "--load); --exit-signal-handler finishes the iteration and saves first")
        sys.exit(INTERRUPTED_EXIT_CODE)
    except RuntimeError as err:
        if not any(marker in str(err) for marker in PEER_LOST_MARKERS):
            raise
        detail = one_line(err)[:PEER_LOST_DETAIL_CHARS]
        print_error_line(prog, f"rank {get_rank()} lost a peer rank, which failed or was killed "
                         f"(see its log); resume with --load from the latest checkpoint "
                         f"({detail})", every_rank=True)  # rank 0 may be the one that died
        sys.exit(TRAINING_FAILED_EXIT_CODE)


def agree_on_errors(step, *args, **kwargs):
    """Runs ``step(*args, **kwargs)`` on every rank; if any rank raised a user error (a
    ValueError or OSError with a user-facing message, or one of :data:`ONE_LINE_ERRORS`),
    every rank raises it, so none is left waiting in a later collective.

    Costs one ``all_gather_object`` over the world: for start-up steps only.
    """
    result, message, kind = None, None, UserInputError
    try:
        result = step(*args, **kwargs)
    except ONE_LINE_ERRORS as err:
        message, kind = one_line(err), type(err)
    except (ValueError, OSError) as err:
        message = one_line(err)
    if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        if message is not None:
            raise kind(message)
        return result
    gathered = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, (message, kind.__name__))
    failed = [(rank, m, k) for rank, (m, k) in enumerate(gathered) if m is not None]
    if failed:
        rank, first, kind_name = failed[0]
        kinds = {cls.__name__: cls for cls in ONE_LINE_ERRORS}
        raise kinds[kind_name](first)
    return result
