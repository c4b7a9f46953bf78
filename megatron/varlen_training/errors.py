"""Errors a user can act on, and how entry points report them: one line, printed once.

Every error in this module is a complete, one-line message naming the file/line or flag, the
value and the limit. :func:`exit_on_user_errors` turns them into ``<prog>: error: <message>`` on
global rank 0 and the exit code below, on every rank, without a traceback. Anything else (a bug)
keeps its traceback.

Ranks must agree on failing, or a rank that did not fail waits in its next collective for
peers that have left: :func:`agree_on_errors` runs a start-up step on every rank and, if any
rank raised a user error, raises it on all of them (named by the first failing rank); if a rank
hit a bug, that rank keeps its traceback and the others stop with :class:`PeerRankError`, one
line naming it.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from megatron.varlen.packing import InvalidScheduleError
from megatron.varlen_training.log import get_rank, is_multi_rank

USAGE_EXIT_CODE = 2  # bad flags or data (argparse's convention)
TRAINING_FAILED_EXIT_CODE = 1  # the run itself went wrong (non-finite loss, bad checkpoint)
FIRST_RANK = 0  # prints an error every rank raised
INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT: how shells report a command stopped by Ctrl-C
INTERRUPTED_TRAINING = ("interrupted by Ctrl-C (SIGINT) during training: the iteration in "
                        "progress is lost, the latest checkpoint is intact (resume with --load); "
                        "--exit-signal-handler finishes the iteration and saves first")


class UserInputError(ValueError):
    """Bad data or a bad flag value found after argument parsing (exit code 2)."""

    exit_code = USAGE_EXIT_CODE


class CheckpointError(ValueError):
    """A checkpoint is missing, partial, corrupted, unsafe, or does not match the run."""

    exit_code = USAGE_EXIT_CODE


class NonFiniteLossError(RuntimeError):
    """A NaN/Inf loss or gradient norm stopped the run (``--check-for-nan-in-loss-and-grad``)."""

    exit_code = TRAINING_FAILED_EXIT_CODE


class PeerRankError(RuntimeError):
    """Another rank hit a bug in a step every rank runs (:func:`agree_on_errors`): this rank
    stops too, in one line naming it; the traceback is in that rank's output. Exit code 1, as
    for the bug itself (an uncaught exception)."""

    exit_code = TRAINING_FAILED_EXIT_CODE


assert InvalidScheduleError.exit_code == TRAINING_FAILED_EXIT_CODE  # a bug: the run went wrong
ONE_LINE_ERRORS = (UserInputError, CheckpointError, NonFiniteLossError, InvalidScheduleError,
                   PeerRankError)
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
    alike: printed once) or, with ``every_rank``, on each rank that calls it. An error from
    :func:`agree_on_errors` names its own printer (``reporting_rank``): rank 0 may be the rank
    whose bug it reports, which shows its traceback instead.

    The only place besides megatron/varlen_training/log.py that prints: a user error is not a log
    record (no rank prefix, no level), it is argparse's one line.
    """
    if every_rank or get_rank() == getattr(message, "reporting_rank", FIRST_RANK):
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
        release_process_group()
        sys.exit(err.exit_code)
    except KeyboardInterrupt as interrupted:  # a message, where it says what was interrupted
        print_error_line(prog, str(interrupted) or INTERRUPTED_TRAINING)
        sys.exit(INTERRUPTED_EXIT_CODE)
    except RuntimeError as err:
        if not any(marker in str(err) for marker in PEER_LOST_MARKERS):
            _release_bug_rank_group()
            raise
        detail = one_line(err)[:PEER_LOST_DETAIL_CHARS]
        print_error_line(prog, f"rank {get_rank()} lost a peer rank, which failed or was killed "
                         f"(see its log); resume with --load from the latest checkpoint "
                         f"({detail})", every_rank=True)  # rank 0 may be the one that died
        sys.exit(TRAINING_FAILED_EXIT_CODE)
    except Exception:
        _release_bug_rank_group()
        raise


def _release_bug_rank_group() -> None:
    """A bug keeps its traceback and exit status 1; under gloo its rank must not then abort at
    exit. (NCCL's teardown may wait for a peer's collectives: that group is left as it is.)"""
    try:
        release_process_group(only_backend="gloo")
    except Exception:  # noqa: BLE001 -- never mask the bug being raised
        pass


def release_process_group(only_backend: str | None = None) -> None:
    """Ends this rank's process group before the interpreter exits: left to the interpreter's
    teardown, gloo's threads can abort the process ("terminate called without an active
    exception", SIGABRT) when a peer has already gone -- as it has after a PeerRankError, or
    for the rank whose bug it reports. ``only_backend``: release only a group of that backend."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    if only_backend is None or torch.distributed.get_backend() == only_backend:
        torch.distributed.destroy_process_group()


# At start-up, a bad file or value surfaces as one of these, with a message made for the user.
START_UP_USER_ERRORS = (ValueError, OSError)
PEER_BUG_DETAIL_CHARS = 200  # a bug's message may hold a tensor: the line names it, the log has it
_ONE_LINE_BY_NAME = {cls.__name__: cls for cls in ONE_LINE_ERRORS}


class _Outcome(NamedTuple):
    """How a rank's step failed, as every rank receives it (plain strings: picklable)."""

    message: str
    kind: str  # a user error's class, "module:qualname"; a bug's type name
    base: str  # the ONE_LINE_ERRORS class to raise where ``kind`` cannot be found
    bug: bool


def _class_path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _one_line_class(outcome: _Outcome, kept: tuple) -> type:
    """The user error's own class (BatchError stays a BatchError on every rank, and keeps its
    exit code), else the one-line class it derives from."""
    module, qualname = outcome.kind.split(":")
    found = sys.modules.get(module)
    for name in qualname.split("."):
        found = getattr(found, name, None)
    if isinstance(found, type) and issubclass(found, ONE_LINE_ERRORS + kept):
        return found
    return _ONE_LINE_BY_NAME[outcome.base]


def _user_error(outcome: _Outcome, kept: tuple) -> Exception:
    cls = _one_line_class(outcome, kept)
    try:
        return cls(outcome.message)
    except TypeError:  # a constructor that takes more than the message
        return _ONE_LINE_BY_NAME[outcome.base](outcome.message)


def peer_rank_error(rank: int, kind: str, message: str) -> PeerRankError:
    """What a rank raises when rank ``rank`` hit a bug (``kind``: the exception's type name)."""
    return PeerRankError(f"rank {rank} raised {kind}: {one_line(message)[:PEER_BUG_DETAIL_CHARS]}"
                         f" (a bug: its traceback is in rank {rank}'s output; this rank stopped "
                         f"with it)")


def _outcome(step, plain_user_errors: tuple, kept: tuple):
    """(result, the outcome shared with the other ranks: None on success, the bug to re-raise
    here)."""
    try:
        return step(), None, None
    except ONE_LINE_ERRORS + kept as err:
        base = next((cls for cls in ONE_LINE_ERRORS if isinstance(err, cls)), UserInputError)
        return None, _Outcome(one_line(err), _class_path(type(err)), base.__name__, False), None
    except plain_user_errors as err:
        user = UserInputError.__name__
        return None, _Outcome(one_line(err), _class_path(UserInputError), user, False), None
    except Exception as err:  # a bug: shared below, then re-raised here with its traceback
        detail = one_line(err)[:PEER_BUG_DETAIL_CHARS]
        return None, _Outcome(detail, type(err).__name__, "", True), err


def _error_for_peers(outcomes: list, kept: tuple) -> Exception | None:
    """The error every rank without a bug raises: the first user error (by rank), else the
    first bug, named; printed once, by the lowest rank that raises it."""
    failed = [(rank, outcome) for rank, outcome in enumerate(outcomes) if outcome is not None]
    if not failed:
        return None
    user_errors = [(rank, outcome) for rank, outcome in failed if not outcome.bug]
    rank, outcome = (user_errors or failed)[0]
    error = (peer_rank_error(rank, outcome.kind, outcome.message) if outcome.bug
             else _user_error(outcome, kept))
    error.reporting_rank = min(r for r, outcome in enumerate(outcomes)
                               if outcome is None or not outcome.bug)
    return error


def agree_and_gather(step: Callable[[], Any], share: Callable[[Any], Any],
                     plain_user_errors: tuple = START_UP_USER_ERRORS,
                     kept_user_errors: tuple = ()) -> tuple[Any, list]:
    """:func:`agree_on_errors` for ``step()``, also gathering ``share(result)`` from every rank
    in the same exchange: ``(result, [share of rank 0, share of rank 1, ...])``.

    ``plain_user_errors``: the exceptions besides :data:`ONE_LINE_ERRORS` that are the user's
    input, not a bug (``()`` where every user error is already one of them, e.g. a batch);
    they become :class:`UserInputError`. ``kept_user_errors``: user errors outside
    :data:`ONE_LINE_ERRORS` that every rank raises as their own class (the facade's
    ``ConfigError`` and ``ArgumentValidationError``, which its script hook reports).
    """
    def step_and_share():  # a failing share is this rank's failure too, never a hang
        result = step()
        return result, share(result)

    pair, outcome, bug = _outcome(step_and_share, plain_user_errors, kept_user_errors)
    result, mine = pair if outcome is None else (None, None)
    gathered = _gather((outcome, mine), bug)
    if bug is not None:
        raise bug
    error = _error_for_peers([outcome for outcome, _ in gathered], kept_user_errors)
    if error is not None:
        raise error
    return result, [shared for _, shared in gathered]


def _gather(mine: tuple, bug: Exception | None) -> list:
    if not is_multi_rank():
        return [mine]
    gathered = [None] * torch.distributed.get_world_size()
    try:
        torch.distributed.all_gather_object(gathered, mine)
    except Exception:  # a peer died meanwhile: this rank's own bug is still the news
        if bug is not None:
            raise bug from None
        raise
    return gathered


def agree_on_errors(step, *args, **kwargs):
    """Runs ``step(*args, **kwargs)`` on every rank; if any rank raised, every rank raises, so
    none is left waiting in a later collective.

    A user error (a ValueError or OSError with a user-facing message, or one of
    :data:`ONE_LINE_ERRORS`, its class kept) is raised on every rank, named by the first rank
    that raised one. A bug (any other exception) is re-raised, traceback and all, on the rank
    that hit it; the other ranks raise :class:`PeerRankError` naming that rank and the bug (a
    user error on some rank wins: it is what the user can act on). Every rank takes part in the
    exchange whatever happened: a rank leaving early would leave its peers in it until the
    collective times out.

    Costs one ``all_gather_object`` over the world: for start-up steps only.
    """
    return agree_and_gather(functools.partial(step, *args, **kwargs), share_nothing)[0]


def share_nothing(result) -> None:
    """The ``share`` of :func:`agree_and_gather` when only the errors are exchanged."""
    del result


def share_result(result):
    """The ``share`` of :func:`agree_and_gather` when every rank's result is gathered."""
    return result
