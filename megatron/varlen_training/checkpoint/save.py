"""The save path: a checkpoint written into a staging folder, published with one rename, and
named latest (the package docstring describes the whole; :mod:`.integrity` the files).

A save that fails for an operational reason stops the run with one line and leaves the previous
checkpoint as the latest: disk full, unwritable or I/O errors on any rank are
:class:`CheckpointSaveError` (exit code 1); Ctrl-C (SIGINT) is
:class:`CheckpointSaveInterrupted`, exit code 130. megatron-core's writer processes ignore a
Ctrl-C; the main process reports it once and ends them.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import multiprocessing
import os
import re
import shutil
import signal
import threading

import torch
from torch.distributed.checkpoint import CheckpointException

from megatron.core import dist_checkpointing
from megatron.varlen_training.checkpoint import integrity, rng_state, sharding, strategies
from megatron.varlen_training.checkpoint.layout import (
    FLOPS_SO_FAR_KEY, TRACKER_FILENAME, checkpoint_dir, read_latest_iteration, sharded_state_dict,
)
from megatron.varlen_training.config import RunConfig
from megatron.varlen_training.errors import (
    INTERRUPTED_EXIT_CODE, PEER_LOST_MARKERS, TRAINING_FAILED_EXIT_CODE, CheckpointError,
    agree_and_gather, one_line, share_result,
)
from megatron.varlen_training.log import print_rank_0
from megatron.varlen_training.resume import run_args_record

_SHARD_FILE = re.compile(r"__(\d+)_\d+\.distcp$")  # torch_dist data files, named by writer rank
_RNG_FILE = re.compile(r"rank_(\d+)\.pt$")
# torch.save to a path reports a failed write (disk full) as a RuntimeError from its C++ zip
# writer, without the OSError; megatron-core writes common.pt that way.
_TORCH_WRITER_FAILURE = "inline_container.cc"
# How an OSError reads once a wrapper's text is all that is left of it: megatron-core wraps
# a writer's OSError in a RuntimeError, and the cause does not survive the pickling that
# brings another rank's failure to rank 0.
_ERRNO_TEXT = re.compile(r"\[Errno (\d+)\] ([^\n]+)")
_REMEDY = {errno.ENOSPC: "free space where --save points", errno.EDQUOT: "raise the quota",
           errno.EACCES: "make --save writable", errno.EROFS: "make --save writable",
           errno.EPERM: "make --save writable"}
_DETAIL_CHARS = 160


class CheckpointSaveError(CheckpointError):
    """A save failed for an operational reason (disk full, unwritable folder, I/O error); the
    run itself failed (exit code 1), not its input."""

    exit_code = TRAINING_FAILED_EXIT_CODE


class CheckpointSaveInterrupted(CheckpointError):
    """Ctrl-C (SIGINT) during a save."""

    exit_code = INTERRUPTED_EXIT_CODE


class _IOFailure(Exception):
    """An I/O failure inside a save, as one line (the save turns it into CheckpointSaveError)."""


_save_in_progress = False
_HELPER_EXIT_S = 10.0  # how long a terminated writer process may take to go


def _writer_ignores_sigint() -> None:
    """Runs in each child forked during a save (megatron-core's file writers). Ctrl-C reaches
    the whole process group; the main process reports it once and stops the writers
    (:func:`_stop_writers`) instead of each printing its own KeyboardInterrupt traceback."""
    if _save_in_progress:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


os.register_at_fork(after_in_child=_writer_ignores_sigint)


def _stop_writers(before: set) -> None:
    """Ends the writer processes a save started (those not in ``before``): an interrupted save
    is discarded, and a writer left running could keep the process from exiting."""
    for child in set(multiprocessing.active_children()) - before:
        child.terminate()
        child.join(timeout=_HELPER_EXIT_S)


def _writer_rank(name: str) -> int:
    """The rank that wrote (and hashes) checkpoint file ``name``; shared files are rank 0's."""
    match = _SHARD_FILE.search(name) or _RNG_FILE.search(name)
    return int(match.group(1)) if match else 0


def _os_error_in(err: BaseException) -> tuple[OSError | None, int | None]:
    """The OSError behind ``err`` (its causes, contexts, and the per-rank failures megatron-core
    gathers into a CheckpointException) and the rank it happened on, if known."""
    pending, seen = [(err, None)], set()
    while pending:
        current, rank = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError):
            return current, rank
        if isinstance(current, CheckpointException):
            pending += [(failure[0], failed_rank)
                        for failed_rank, failure in current.failures.items()]
        elif match := _ERRNO_TEXT.search(str(current)):
            return OSError(int(match.group(1)), match.group(2).strip()), rank
        pending += [(current.__cause__, rank), (current.__context__, rank)]
    return None, None


def _io_failure(err: BaseException) -> str | None:
    """``err``, raised on this rank, as one line if it is an I/O failure (disk full,
    unwritable, ...), else None (a bug, or a lost peer rank: they keep their own reporting)."""
    if any(marker in str(err) for marker in PEER_LOST_MARKERS):
        return None  # another rank died: exit_on_user_errors reports that
    os_error, rank = _os_error_in(err)
    where = f"on rank {torch.distributed.get_rank() if rank is None else rank}"
    if os_error is not None:
        name = errno.errorcode.get(os_error.errno, "")
        what = os_error.strerror or one_line(os_error)[:_DETAIL_CHARS]
        file = f" writing {os_error.filename}" if os_error.filename else ""
        remedy = _REMEDY.get(os_error.errno, "fix the cause")
        return f"{what}{f' [{name}]' if name else ''}{file} {where} ({remedy})"
    if isinstance(err, CheckpointException) and not err.failures:
        return "a write failed on another rank (rank 0 names it)"  # failures go to rank 0
    if isinstance(err, RuntimeError) and _TORCH_WRITER_FAILURE in str(err):
        return (f"torch.save could not write a file {where}: {one_line(err)[:_DETAIL_CHARS]} "
                f"(check free space and permissions where --save points)")
    return None


def _save_step(step, step_args: tuple):
    """``step(*step_args)``, an I/O failure raised as :class:`_IOFailure` (one line); a bug or
    a lost peer keeps its own exception."""
    try:
        return step(*step_args)
    except (OSError, RuntimeError) as err:
        failure = _io_failure(err)
        if failure is None:
            raise
        raise _IOFailure(failure) from err


def _agree_on_save(step, *args) -> list:
    """Runs ``step(*args)`` on every rank and gathers the results (rank order); if any rank
    hit an I/O failure, raises it on every rank, so none waits for a peer that gave up; a bug
    on one rank keeps its traceback there and stops the others in one line
    (``errors.agree_and_gather``)."""
    return agree_and_gather(functools.partial(_save_step, step, args), share_result,
                            plain_user_errors=(), kept_user_errors=(_IOFailure,))[1]


def _on_rank_0(step, *args):
    return step(*args) if torch.distributed.get_rank() == 0 else None


def _prepare_staging(root: str, staging: str) -> None:
    stale = integrity.remove_stale_staging(root)
    if stale:
        print_rank_0(f" > removed {', '.join(stale)} from {root}: left by a save that did not "
                     f"finish")
    os.makedirs(staging)


def _write_own_files(staging: str, run: RunConfig, extra_files: dict[str, str] | None,
                     iteration: int, positions: tuple[int | None, int | None]) -> None:
    """This rank's RNG states; rank 0 also the run description (with the data positions:
    training and validation samples consumed) and the caller's files."""
    if not run.checkpoint.no_save_rng:
        rng_state.save(staging)
    if torch.distributed.get_rank() == 0:
        run_args_record.save_run_args(staging, run, iteration, *positions)
        for name, text in (extra_files or {}).items():
            integrity.atomic_write_text(os.path.join(staging, name), text)


def _digest_own_files(folder: str) -> dict[str, dict]:
    """Hashes, on every rank in parallel, the files this rank wrote; all ranks get them all."""
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    names = [n for n in integrity.relative_files(folder) if _writer_rank(n) % world == rank]
    parts = _agree_on_save(integrity.digest_files, folder, names)
    return {name: entry for part in parts for name, entry in part.items()}


@contextlib.contextmanager
def _sigint_held():
    """Holds a Ctrl-C back until the block is done: between publish()'s two renames (the same
    iteration saved again) an interrupt would leave neither copy of that iteration."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach the main thread only
        return
    received = []
    previous = signal.signal(signal.SIGINT, lambda signum, _: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if received:
        signal.raise_signal(signal.SIGINT)  # now handled as it would have been


def _publish(root: str, iteration: int, staging: str, path: str, entries: dict) -> None:
    integrity.write_manifest(staging, entries, torch.distributed.get_world_size())
    with _sigint_held():
        integrity.publish(staging, path)
        integrity.atomic_write_text(os.path.join(root, TRACKER_FILENAME), str(iteration))


def _write_and_publish(root: str, iteration: int, staging: str, path: str, model, optimizer,
                       scheduler, run: RunConfig, extra_files, positions, common: dict) -> None:
    """The save's steps; ``common``: values saved beside the iteration (megatron-core's
    common.pt)."""
    _agree_on_save(_on_rank_0, _prepare_staging, root, staging)
    metadata = sharding.save_metadata(run)
    sharding_type = metadata.get(sharding.SHARDING_TYPE_KEY)
    if sharding_type is not None:  # Megatron-LM's line
        print_rank_0(f"Storing distributed optimizer sharded state of type {sharding_type}")
    state = sharded_state_dict(model, optimizer, scheduler, iteration, is_loading=False,
                               metadata=metadata, with_optimizer=not run.checkpoint.no_save_optim)
    state.update(common)
    # megatron-core gathers its writers' failures and raises them on every rank.
    dist_checkpointing.save(state, staging, strategies.save_strategy(run.checkpoint),
                            content_metadata=metadata)
    _agree_on_save(_write_own_files, staging, run, extra_files, iteration, positions)
    entries = _digest_own_files(staging)
    _agree_on_save(_on_rank_0, _publish, root, iteration, staging, path, entries)


def _latest_or_none(root: str) -> int | None:
    try:
        return read_latest_iteration(root)
    except (CheckpointError, OSError):
        return None


def _failed_save_message(root: str, iteration: int, why: str) -> str:
    latest = _latest_or_none(root)
    if latest == iteration:  # the failure came after the tracker named it
        return (f"{why} after checkpoint iteration {iteration} was saved to {root!r}: it is the "
                f"latest checkpoint; resume with --load {root}")
    still = (f"the latest checkpoint is still iteration {latest}" if latest is not None
             else "there is no complete checkpoint there yet")
    return (f"checkpoint iteration {iteration} was not saved to {root!r}: {why}; {still}; "
            f"resume with --load {root}")


def _discard(staging: str) -> None:
    """Removes a failed save's staging folder (on a full disk, its space is needed)."""
    if torch.distributed.get_rank() == 0:
        shutil.rmtree(staging, ignore_errors=True)


def save_checkpoint(root: str, iteration: int, model, optimizer, scheduler, run: RunConfig,
                    extra_files: dict[str, str] | None = None,
                    consumed_samples: int | None = None,
                    consumed_valid_samples: int | None = None,
                    num_floating_point_operations_so_far: int | None = None) -> str:
    """Writes iteration ``iteration`` under ``root``, publishes it atomically and updates the
    tracker file (module docstring). ``run``: the run, recorded for resume checks;
    ``extra_files``: ``{name: text}`` written by rank 0 into the checkpoint (and its manifest);
    ``consumed_samples``: the training samples trained so far (default iteration x
    --global-batch-size); ``consumed_valid_samples``: the validation samples read so far
    (Megatron-LM's ``consumed_valid_samples``; not recorded when None);
    ``num_floating_point_operations_so_far``: the floating-point operations trained so far,
    under Megatron-LM's key (not recorded when None).

    Raises:
        CheckpointSaveError: disk full, unwritable or an I/O error on any rank (every rank).
        CheckpointSaveInterrupted: Ctrl-C during the save.
    """
    global _save_in_progress
    path = checkpoint_dir(root, iteration)
    staging = integrity.staging_dir(path)
    helpers_before = set(multiprocessing.active_children())
    _save_in_progress = True
    try:
        common = {} if num_floating_point_operations_so_far is None \
            else {FLOPS_SO_FAR_KEY: num_floating_point_operations_so_far}
        _write_and_publish(root, iteration, staging, path, model, optimizer, scheduler, run,
                           extra_files, (consumed_samples, consumed_valid_samples), common)
    except KeyboardInterrupt:
        _stop_writers(helpers_before)
        _discard(staging)
        raise CheckpointSaveInterrupted(_failed_save_message(
            root, iteration, "interrupted by Ctrl-C (SIGINT)")) from None
    except _IOFailure as failure:
        _discard(staging)
        raise CheckpointSaveError(_failed_save_message(root, iteration, str(failure))) from None
    except (OSError, RuntimeError, CheckpointException) as err:
        reason = _io_failure(err)
        if reason is None:
            raise
        _discard(staging)
        raise CheckpointSaveError(_failed_save_message(root, iteration, reason)) from None
    finally:
        _save_in_progress = False
    return path
