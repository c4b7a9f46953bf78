"""Save and resume with megatron-core dist_checkpointing (torch_dist format).

Layout (Megatron-LM's): ``<dir>/iter_0000003/`` holds one checkpoint and
``<dir>/latest_checkpointed_iteration.txt`` names the newest. The iteration in the directory
name is the number of iterations completed, i.e. the one the last log line printed.
The optimizer state's layout (the distributed optimizer's ``dp_reshardable`` or, with
``--dist-ckpt-optim-fully-reshardable``, ``fully_reshardable`` format) is stored as
megatron-core's content metadata and a load reads it back (:mod:`checkpoint_sharding`).

Besides megatron-core's files, each checkpoint holds ``manifest.json`` (size and SHA-256 of
every file), ``run_args.json`` (what shapes the model, data order and schedule) and
``rng/rank_NNNNN.pt`` (each rank's generator states;
not with ``--no-save-rng``: checkpoint_parts.py). Saving writes a hidden staging folder and
publishes it with one rename, then replaces the tracker atomically
(:mod:`~megatron.varlen_training.checkpoint_integrity`). Loading checks, before megatron-core reads
anything: the tracker, the folder, that the manifest lists every file in it and every file the
format needs, every file against the manifest, that ``.metadata`` holds only
checkpoint-metadata classes and that the small files are well-formed
(:mod:`~megatron.varlen_training.checkpoint_safe_load`), and that the run continues the saved one
(:mod:`~megatron.varlen_training.resume_consistency`); a folder in another format is refused
first (:mod:`~megatron.varlen_training.checkpoint_format`), and distributed-optimizer state that
does not fit this run's gradient buckets when megatron-core reads it. Every problem is a
one-line :class:`~megatron.varlen_training.errors.CheckpointError`.

A save that fails for an operational reason stops the run with one line and leaves the previous
checkpoint as the latest (its staging folder is removed; staging folders left by killed saves
are removed at the next save): disk full, unwritable or I/O errors on any rank are
:class:`CheckpointSaveError` (exit code 1, like other failures of the run itself); Ctrl-C
(SIGINT) is :class:`CheckpointSaveInterrupted`, exit code 130 (128 + SIGINT, what a shell
reports for an interrupted command). A Ctrl-C reaches the whole process group: megatron-core's
writer processes ignore it, and the main process reports it once and ends them. A Ctrl-C while
the checkpoint is renamed into place and the tracker replaced is held until both are done.
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
from megatron.core.dist_checkpointing.core import CheckpointingException
from megatron.core.transformer.utils import ensure_metadata_has_dp_cp_group
from megatron.varlen_training import checkpoint_integrity as integrity
from megatron.varlen_training import (
    checkpoint_format, checkpoint_parts, checkpoint_sharding, checkpoint_strategies,
    load_options, resume_consistency, rng_state,
)
from megatron.varlen_training import checkpoint_optimizer_state as optimizer_state
from megatron.varlen_training.config import RunConfig
from megatron.varlen_training.checkpoint_safe_load import (
    COMMON_FILENAME, CONFIG_FILENAME, METADATA_FILENAME, check_common_is_safe, check_config,
    check_metadata_is_safe, shard_files,
)
from megatron.varlen_training.errors import (
    INTERRUPTED_EXIT_CODE, PEER_LOST_MARKERS, TRAINING_FAILED_EXIT_CODE, CheckpointError,
    agree_and_gather, agree_on_errors, one_line, share_result,
)
from megatron.varlen_training.log import print_rank_0
from megatron.varlen_training.model import unwrap

TRACKER_FILENAME = load_options.TRACKER_FILENAME  # latest_checkpointed_iteration.txt
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
# megatron-core's report of mismatching keys under a raising --dist-ckpt-strictness.
_STRICT_MISMATCH_MARKS = ("Missing keys", "Unexpected keys")
# megatron-core's key of a distributed-optimizer bucket's state (dp_reshardable), and the global
# shape mismatch torch_dist reports when this run's bucket differs from the saved one.
_OPTIMIZER_BUCKET_KEY = re.compile(r"optimizer\.distributed\.[^\n]*?bucket_idx_(\d+)")
_SHAPE_MISMATCH = re.compile(r"loaded \(torch\.Size\(\[(\d+)\]\)\) and expected \(\((\d+),\)\)")


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


checkpoint_dir = load_options.iteration_folder  # root, iteration -> <root>/iter_0000003


def model_keys(model) -> list[str]:
    """The checkpoint key of each model chunk: ``model``, or ``model0``, ``model1``, ... with
    virtual pipeline stages (Megatron-LM's names)."""
    return ["model"] if len(model) == 1 else [f"model{i}" for i in range(len(model))]


def model_sharded_state_dict(chunk) -> dict:
    """A model chunk's sharded state dict, with the metadata megatron-core's GPTModel reads
    (its DP x CP group: an MTP stage without the embedding ties its embedding copy with it;
    without the metadata every such save failed)."""
    return unwrap(chunk).sharded_state_dict(metadata=ensure_metadata_has_dp_cp_group(None))


def _sharded_state_dict(model, optimizer, scheduler, iteration: int, is_loading: bool,
                        metadata: dict, with_optimizer: bool = True) -> dict:
    """The model chunks' state, the iteration and (``with_optimizer``) the optimizer state and
    LR/WD schedule, as dist_checkpointing saves them or fills them on load; ``metadata``: how
    the optimizer state is laid out (:mod:`checkpoint_sharding`)."""
    state = {key: model_sharded_state_dict(chunk)
             for key, chunk in zip(model_keys(model), model)}
    if with_optimizer:
        # Virtual stages keep their own dicts: their local names collide ("decoder.layers.0.*"
        # in every chunk), and a merged dict lost all but the last chunk's parameters, so a
        # save without the distributed optimizer failed (megatron-core walks any nesting).
        model_state = state["model"] if len(model) == 1 else {
            key: state[key] for key in model_keys(model)}
        state["optimizer"] = optimizer.sharded_state_dict(
            model_state, is_loading=is_loading, metadata=metadata)
        state["opt_param_scheduler"] = scheduler.state_dict()
    state["iteration"] = iteration
    return state


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
        resume_consistency.save_run_args(staging, run, iteration, *positions)
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
                       scheduler, run: RunConfig, extra_files, positions) -> None:
    _agree_on_save(_on_rank_0, _prepare_staging, root, staging)
    metadata = checkpoint_sharding.save_metadata(run)
    state = _sharded_state_dict(model, optimizer, scheduler, iteration, is_loading=False,
                                metadata=metadata, with_optimizer=not run.checkpoint.no_save_optim)
    # megatron-core gathers its writers' failures and raises them on every rank.
    dist_checkpointing.save(state, staging, checkpoint_strategies.save_strategy(run.checkpoint),
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
                    consumed_valid_samples: int | None = None) -> str:
    """Writes iteration ``iteration`` under ``root``, publishes it atomically and updates the
    tracker file (module docstring). ``run``: the run, recorded for resume checks;
    ``extra_files``: ``{name: text}`` written by rank 0 into the checkpoint (and its manifest);
    ``consumed_samples``: the training samples trained so far (default iteration x
    --global-batch-size); ``consumed_valid_samples``: the validation samples read so far
    (Megatron-LM's ``consumed_valid_samples``; not recorded when None).

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
        _write_and_publish(root, iteration, staging, path, model, optimizer, scheduler, run,
                           extra_files, (consumed_samples, consumed_valid_samples))
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


def read_latest_iteration(root: str) -> int:
    """The iteration named by the tracker file; a one-line CheckpointError if it is unusable."""
    try:
        return load_options.read_latest_iteration(root)
    except load_options.TrackerError as err:
        raise CheckpointError(str(err)) from None


def _saved_run_args(folder: str) -> dict:
    """The checkpoint's run_args.json; empty when missing or unreadable (other checks say so)."""
    try:
        return resume_consistency.read_run_args(folder)
    except CheckpointError:
        return {}


def _held_parts(folder: str) -> dict[str, bool]:
    """The parts the checkpoint in ``folder`` says it holds (--no-save-optim/--no-save-rng)."""
    return checkpoint_parts.recorded_parts(_saved_run_args(folder))


def _required_files(entries: dict[str, dict], world_size: int | None,
                    with_rng: bool = True) -> dict[str, str]:
    """The files (name -> why) every checkpoint of this format has, besides the shards
    ``.metadata`` names: megatron-core's and ours, and (``with_rng``: not saved with
    --no-save-rng) one RNG file per saving rank."""
    required = {name: "every checkpoint has one" for name in (
        METADATA_FILENAME, CONFIG_FILENAME, COMMON_FILENAME, resume_consistency.RUN_ARGS_FILENAME)}
    if not with_rng:
        return required
    if world_size is None:  # manifests written before the world size: the RNG files listed
        world_size = sum(1 for name in entries if name.startswith(rng_state.RNG_SUBDIR + "/"))
    required.update({rng_state.rng_filename(rank): f"the random states of rank {rank} of "
                     f"{world_size}" for rank in range(max(world_size, 1))})
    return required


def _verify_share(folder: str) -> None:
    """Checks that the manifest covers the checkpoint, then this rank's 1/world share of its
    files (all ranks together check every file)."""
    entries, world_size = integrity.read_manifest(folder)
    integrity.check_complete(folder, entries, _required_files(
        entries, world_size, with_rng=_held_parts(folder)["rng"]))
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    integrity.verify_files(folder, entries, sorted(entries)[rank::world])


def consumed_samples_at(root: str, iteration: int, run: RunConfig) -> int:
    """The training samples consumed by the checkpoint of ``iteration`` under ``root`` (as its
    ``run_args.json`` records them; iteration x --global-batch-size for checkpoints saved
    before they were recorded); 0 at iteration 0 (``--finetune`` starts a new run)."""
    if iteration == 0:
        return 0
    return resume_consistency.consumed_samples(checkpoint_dir(root, iteration), iteration, run)


def consumed_valid_samples_at(root: str, iteration: int, run: RunConfig) -> int:
    """The validation samples read before the checkpoint of ``iteration`` under ``root`` was
    saved, where the resumed run's validation continues: as its ``run_args.json`` records them
    (Megatron-LM's ``consumed_valid_samples``); for checkpoints saved before they were
    recorded, derived from the iteration as Megatron-LM derives them for its own older
    checkpoints (iteration // --eval-interval evaluations of --eval-iters global batches), and
    said; 0 at iteration 0 (``--finetune`` starts a new run)."""
    if iteration == 0:
        return 0
    folder = checkpoint_dir(root, iteration)
    recorded = agree_on_errors(resume_consistency.recorded_valid_samples, folder)
    if recorded is not None:
        return recorded
    training = run.training
    derived = iteration // training.eval_interval * training.eval_iters \
        * training.global_batch_size
    print_rank_0(f" > {folder} records no {resume_consistency.VALID_POSITION_KEY} (saved before "
                 f"it was recorded): validation continues after {derived} samples, derived from "
                 f"iteration {iteration} (// --eval-interval {training.eval_interval} x "
                 f"--eval-iters {training.eval_iters} x --global-batch-size "
                 f"{training.global_batch_size})")
    return derived


def _check_format_files(folder: str) -> None:
    """What megatron-core reads first, once verified: ``.metadata`` unpickles safely and names
    only listed shards, ``metadata.json`` is well-formed, ``common.pt`` holds plain data."""
    shards = shard_files(folder, check_metadata_is_safe(folder))
    entries, _ = integrity.read_manifest(folder)
    integrity.check_complete(folder, entries, {name: f"named by {METADATA_FILENAME}"
                                               for name in shards})
    check_config(folder)
    check_common_is_safe(folder)


def _check_step(root: str, step: int) -> int:
    """``--ckpt-step``'s iteration, if ``root`` has its folder; else a one-line CheckpointError
    listing the iterations it has."""
    if os.path.isdir(checkpoint_dir(root, step)):
        return step
    saved = load_options.saved_iterations(root)
    have = f"it has {', '.join(map(str, saved))}" if saved else "it has none"
    raise CheckpointError(f"--ckpt-step {step}: {root!r} holds no checkpoint of iteration "
                          f"{step} ({have}); pass one of those, or leave --ckpt-step out to "
                          f"load the latest")


def check_checkpoint(root: str, step: int | None = None) -> tuple[int, str]:
    """The latest iteration (``step``: that one, ``--ckpt-step``) and its folder, verified and
    safe to read, or a CheckpointError raised on every rank."""
    if step is None:
        iteration = agree_on_errors(read_latest_iteration, root)
    else:
        iteration = agree_on_errors(_check_step, root, step)
    folder = checkpoint_dir(root, iteration)
    if not os.path.isdir(folder):
        raise CheckpointError(f"{TRACKER_FILENAME} in {root!r} names iteration {iteration} but "
                              f"{folder!r} is missing")
    agree_on_errors(checkpoint_format.check_saved_format, folder)
    agree_on_errors(_verify_share, folder)  # every file verified before any is parsed
    agree_on_errors(_check_format_files, folder)
    return iteration, folder


def _check_run_args(folder: str, iteration: int, run: RunConfig,
                    parts: load_options.LoadParts) -> None:
    """Refuses a run that would not continue the saved one (``--finetune``: a model of another
    shape), on every rank; rank 0 alone reads the data files for their fingerprints."""
    note = agree_on_errors(resume_consistency.check_run_args, folder, run,
                           torch.distributed.get_rank() == 0, parts)
    if note is not None:
        print_rank_0(f" > {note}")
    if not parts.finetune:  # a fine-tuning run starts its own data stream at sample 0
        position = agree_on_errors(resume_consistency.data_position_note, folder, iteration, run)
        print_rank_0(f" > {position}")


def _restore_optimizer(state: dict, optimizer, scheduler, run: RunConfig | None) -> None:
    """The loaded optimizer state and LR/WD schedule into ``optimizer`` and ``scheduler``."""
    if run is not None:
        resume_consistency.check_scheduler(state["opt_param_scheduler"], scheduler, run)
    optimizer_state.load(optimizer, state["optimizer"])
    scheduler.load_state_dict(state["opt_param_scheduler"])


def _restore_rng(folder: str, parts: load_options.LoadParts) -> None:
    if not parts.rng:
        print_rank_0(f" > {folder}: random states not loaded (--no-load-rng, --finetune, or "
                     f"saved with --no-save-rng)")
        return
    if not agree_on_errors(rng_state.load, folder):  # a bad file on one rank stops all
        print_rank_0(f" > {folder}: random states not restored (saved on another parallel "
                     f"layout): dropout will differ from an uninterrupted run")


def _bucket_mismatch(err: BaseException) -> str | None:
    """``err`` as one line if megatron-core refused the distributed optimizer's state because
    this run's gradient buckets differ from the saved ones, else None."""
    text = str(err)
    bucket = _OPTIMIZER_BUCKET_KEY.search(text)
    if bucket is None:
        return None
    shapes = _SHAPE_MISMATCH.search(text)
    detail = (f"saved bucket {bucket.group(1)} holds {shapes.group(1)} parameters, this run's "
              f"{shapes.group(2)}" if shapes else f"bucket {bucket.group(1)} does not match")
    return (f"--load: the checkpoint's distributed optimizer state does not fit this run's "
            f"gradient buckets ({detail}): megatron-core's dp_reshardable format stores it per "
            f"DDP bucket, and the bucket size follows --overlap-grad-reduce (with it, buckets "
            f"of max(40M, 1M x data-parallel size) parameters, or --ddp-bucket-size / "
            f"--ddp-num-buckets; without it, one per buffer); resume with the checkpoint's "
            f"--overlap-grad-reduce and bucket flags and data-parallel size, or add "
            f"--no-load-optim to load the weights only")


def _load_state(template: dict, folder: str, run: RunConfig | None = None) -> dict:
    """dist_checkpointing's load of ``template`` from ``folder`` (with ``run``: its
    --ckpt-fully-parallel-load and --dist-ckpt-strictness); a bucket layout the saved
    distributed optimizer state does not fit is one line (megatron-core raises a traceback
    of torch's CheckpointException, a BaseException, on every rank)."""
    options = {} if run is None else {
        "sharded_strategy": checkpoint_strategies.load_strategy(run.checkpoint, folder),
        "strict": run.checkpoint.dist_ckpt_strictness}
    try:
        return dist_checkpointing.load(template, folder, **options)
    except (CheckpointException, CheckpointingException, RuntimeError, KeyError) as err:
        problem = _bucket_mismatch(err) or _strict_mismatch(err, run)
        if problem is None:
            raise
        raise CheckpointError(problem) from None


def _strict_mismatch(err: BaseException, run: RunConfig | None) -> str | None:
    """``err`` as one line if it is megatron-core's report of keys the checkpoint and the
    loaded state do not share, raised as --dist-ckpt-strictness asked, else None."""
    if run is None or not isinstance(err, CheckpointingException) \
            or not any(mark in str(err) for mark in _STRICT_MISMATCH_MARKS):
        return None
    strictness = run.checkpoint.dist_ckpt_strictness
    return (f"--load: --dist-ckpt-strictness {strictness} stops on keys the checkpoint and this "
            f"run do not share: {one_line(err)[:_DETAIL_CHARS * 2]}")


def _parts_held(folder: str, parts: load_options.LoadParts,
                run: RunConfig | None) -> load_options.LoadParts:
    """``parts`` narrowed to what the checkpoint holds, as Megatron-LM's load: no optimizer
    state to restore (or another --optimizer's) is one line on every rank; no random states,
    none restored."""
    saved = agree_on_errors(_saved_run_args, folder)
    return agree_on_errors(
        checkpoint_parts.parts_to_load, folder, checkpoint_parts.recorded_parts(saved), parts,
        checkpoint_parts.recorded_optimizer(saved),
        None if run is None else run.optimizer.optimizer)


def load_checkpoint(root: str, model, optimizer, scheduler, run: RunConfig | None = None,
                    parts: load_options.LoadParts = load_options.RESUME) -> int:
    """Restores the model and, as ``parts`` says (Megatron-LM's ``--finetune``,
    ``--no-load-optim``, ``--no-load-rng``), the optimizer and LR scheduler and the RNG states;
    returns the iteration to continue from (0 for ``--finetune``). With ``run``, refuses a run
    that would not continue the saved one (``--finetune``: a model of another shape)."""
    iteration, folder = check_checkpoint(root, parts.step)
    parts = _parts_held(folder, parts, run)
    if run is not None:
        _check_run_args(folder, iteration, run, parts)
    if parts.optimizer:
        optimizer_state.materialize(optimizer)
    metadata = checkpoint_sharding.load_metadata(
        agree_on_errors(dist_checkpointing.load_content_metadata, folder))
    template = _sharded_state_dict(model, optimizer, scheduler, iteration, is_loading=True,
                                   metadata=metadata, with_optimizer=parts.optimizer)
    state = _load_state(template, folder, run)
    for key, chunk in zip(model_keys(model), model):
        unwrap(chunk).load_state_dict(state[key])
    if parts.optimizer:
        _restore_optimizer(state, optimizer, scheduler, run)
    else:  # the optimizer's fp32 main copy of half-precision weights follows the loaded weights
        optimizer.reload_model_params()
    _restore_rng(folder, parts)
    if parts.finetune:
        print_rank_0(f" > fine-tuning from {folder}: model weights only, starting at iteration 0")
        return 0
    return int(state["iteration"])
