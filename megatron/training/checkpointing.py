"""Save and resume with megatron-core dist_checkpointing (torch_dist format).

Layout (Megatron-LM's): ``<dir>/iter_0000003/`` holds one checkpoint and
``<dir>/latest_checkpointed_iteration.txt`` names the newest. The iteration in the directory
name is the number of iterations completed, i.e. the one the last log line printed.
Optimizer state uses megatron-core's ``dp_reshardable`` distributed-optimizer format.

Besides megatron-core's files, each checkpoint holds ``manifest.json`` (size and SHA-256 of
every file), ``run_args.json`` (what shapes the model, data order and schedule) and
``rng/rank_NNNNN.pt`` (each rank's generator states). Saving writes a hidden staging folder and
publishes it with one rename, then replaces the tracker atomically
(:mod:`~megatron.training.checkpoint_integrity`). Loading checks, before megatron-core reads
anything: the tracker, the folder, that the manifest lists every file in it and every file the
format needs, every file against the manifest, that ``.metadata`` holds only
checkpoint-metadata classes and that the small files are well-formed
(:mod:`~megatron.training.checkpoint_safe_load`), and that the run continues the saved one
(:mod:`~megatron.training.resume_consistency`). Every problem is a one-line
:class:`~megatron.training.errors.CheckpointError`.
"""

from __future__ import annotations

import os
import re
import shutil

import torch

from megatron.core import dist_checkpointing
from megatron.training import checkpoint_integrity as integrity
from megatron.training import resume_consistency, rng_state
from megatron.training.checkpoint_safe_load import (
    COMMON_FILENAME, CONFIG_FILENAME, METADATA_FILENAME, check_common_is_safe, check_config,
    check_metadata_is_safe, shard_files,
)
from megatron.training.errors import CheckpointError, agree_on_errors
from megatron.training.log import print_rank_0
from megatron.training.model import unwrap

TRACKER_FILENAME = "latest_checkpointed_iteration.txt"
_OPTIMIZER_METADATA = {"distrib_optim_sharding_type": "dp_reshardable"}
_SHARD_FILE = re.compile(r"__(\d+)_\d+\.distcp$")  # torch_dist data files, named by writer rank
_RNG_FILE = re.compile(r"rank_(\d+)\.pt$")


def checkpoint_dir(root: str, iteration: int) -> str:
    return os.path.join(root, f"iter_{iteration:07d}")


def _model_keys(model) -> list[str]:
    return ["model"] if len(model) == 1 else [f"model{i}" for i in range(len(model))]


def _sharded_state_dict(model, optimizer, scheduler, iteration: int, is_loading: bool) -> dict:
    state = {key: unwrap(chunk).sharded_state_dict()
             for key, chunk in zip(_model_keys(model), model)}
    model_state = state["model"] if len(model) == 1 else {
        k: v for key in _model_keys(model) for k, v in state[key].items()}
    state["optimizer"] = optimizer.sharded_state_dict(
        model_state, is_loading=is_loading, metadata=_OPTIMIZER_METADATA)
    state["opt_param_scheduler"] = scheduler.state_dict()
    state["iteration"] = iteration
    return state


def _barrier() -> None:
    if torch.distributed.is_initialized():
        torch.distributed.barrier()


def _writer_rank(name: str) -> int:
    """The rank that wrote (and hashes) checkpoint file ``name``; shared files are rank 0's."""
    match = _SHARD_FILE.search(name) or _RNG_FILE.search(name)
    return int(match.group(1)) if match else 0


def _digest_own_files(folder: str) -> dict[str, dict]:
    """Hashes, on every rank in parallel, the files this rank wrote; rank 0 gets them all."""
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    names = [n for n in integrity.relative_files(folder) if _writer_rank(n) % world == rank]
    gathered = [None] * world
    torch.distributed.all_gather_object(gathered, integrity.digest_files(folder, names))
    return {name: entry for part in gathered for name, entry in part.items()}


def save_checkpoint(root: str, iteration: int, model, optimizer, scheduler, args=None,
                    extra_files: dict[str, str] | None = None) -> str:
    """Writes iteration ``iteration`` under ``root``, publishes it atomically and updates the
    tracker file (module docstring). ``args``: the run's arguments, recorded for resume checks;
    ``extra_files``: ``{name: text}`` written by rank 0 into the checkpoint (and its manifest).
    """
    path = checkpoint_dir(root, iteration)
    staging = integrity.staging_dir(path)
    if torch.distributed.get_rank() == 0:
        shutil.rmtree(staging, ignore_errors=True)  # left by a save that crashed
        os.makedirs(staging)
    _barrier()
    state = _sharded_state_dict(model, optimizer, scheduler, iteration, is_loading=False)
    dist_checkpointing.save(state, staging)
    rng_state.save(staging)
    if torch.distributed.get_rank() == 0:
        if args is not None:
            resume_consistency.save_run_args(staging, args)
        for name, text in (extra_files or {}).items():
            integrity.atomic_write_text(os.path.join(staging, name), text)
    _barrier()
    entries = _digest_own_files(staging)
    if torch.distributed.get_rank() == 0:
        integrity.write_manifest(staging, entries, torch.distributed.get_world_size())
        integrity.publish(staging, path)
        integrity.atomic_write_text(os.path.join(root, TRACKER_FILENAME), str(iteration))
    _barrier()
    return path


def read_latest_iteration(root: str) -> int:
    """The iteration named by the tracker file; a one-line CheckpointError if it is unusable."""
    tracker = os.path.join(root, TRACKER_FILENAME)
    if not os.path.isfile(tracker):
        raise CheckpointError(f"--load {root!r} holds no checkpoint ({TRACKER_FILENAME} is "
                              f"missing)")
    with open(tracker, encoding="utf-8", errors="replace") as handle:
        text = handle.read().strip()
    if not text.isdigit():
        raise CheckpointError(f"tracker file {tracker!r} is {'empty' if not text else 'garbled'} "
                              f"(got {text[:40]!r}); it should hold the latest iteration number")
    return int(text)


def _required_files(entries: dict[str, dict], world_size: int | None) -> dict[str, str]:
    """The files (name -> why) every checkpoint of this format has, besides the shards
    ``.metadata`` names: megatron-core's and ours, and one RNG file per saving rank."""
    required = {name: "every checkpoint has one" for name in (
        METADATA_FILENAME, CONFIG_FILENAME, COMMON_FILENAME, resume_consistency.RUN_ARGS_FILENAME)}
    if world_size is None:  # manifests written before the world size: the RNG files listed
        world_size = sum(1 for name in entries if name.startswith(rng_state.RNG_SUBDIR + "/"))
    required.update({rng_state.rng_filename(rank): f"the random states of rank {rank} of "
                     f"{world_size}" for rank in range(max(world_size, 1))})
    return required


def _verify_share(folder: str) -> None:
    """Checks that the manifest covers the checkpoint, then this rank's 1/world share of its
    files (all ranks together check every file)."""
    entries, world_size = integrity.read_manifest(folder)
    integrity.check_complete(folder, entries, _required_files(entries, world_size))
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    integrity.verify_files(folder, entries, sorted(entries)[rank::world])


def _check_format_files(folder: str) -> None:
    """What megatron-core reads first, once verified: ``.metadata`` unpickles safely and names
    only listed shards, ``metadata.json`` is well-formed, ``common.pt`` holds plain data."""
    shards = shard_files(folder, check_metadata_is_safe(folder))
    entries, _ = integrity.read_manifest(folder)
    integrity.check_complete(folder, entries, {name: f"named by {METADATA_FILENAME}"
                                               for name in shards})
    check_config(folder)
    check_common_is_safe(folder)


def check_checkpoint(root: str) -> tuple[int, str]:
    """The latest iteration and its folder, verified and safe to read, or a CheckpointError
    raised on every rank."""
    iteration = agree_on_errors(read_latest_iteration, root)
    folder = checkpoint_dir(root, iteration)
    if not os.path.isdir(folder):
        raise CheckpointError(f"{TRACKER_FILENAME} in {root!r} names iteration {iteration} but "
                              f"{folder!r} is missing")
    agree_on_errors(_verify_share, folder)  # every file verified before any is parsed
    agree_on_errors(_check_format_files, folder)
    return iteration, folder


def _check_run_args(folder: str, args) -> None:
    """Refuses a run that would not continue the saved one, on every rank; rank 0 alone reads
    the data files for their fingerprints."""
    note = agree_on_errors(resume_consistency.check_run_args, folder, args,
                           torch.distributed.get_rank() == 0)
    if note is not None:
        print_rank_0(f" > {note}")


def _materialize_optimizer_state(optimizer) -> None:
    """Gives a fresh optimizer the state entries a checkpoint will fill.

    megatron-core's DistributedOptimizer builds its loading template from its current state,
    and without Apex/TE it expects torch Adam's ``step`` entry in it; a fresh optimizer has no
    state at all, and ``init_state_fn`` creates the moments but not ``step``. The values
    written here are placeholders: the load overwrites every one of them.
    """
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        if getattr(opt, "init_state_fn", None) is None or opt.optimizer is None:
            continue
        opt.init_state_fn(opt.optimizer, opt.config)
        for state in opt.optimizer.state.values():
            state.setdefault("step", torch.zeros((), dtype=torch.float32))


def _restore_adam_steps(optimizer) -> None:
    """Per-parameter Adam ``step`` from the restored param groups, one tensor per parameter.

    Without Apex/TE, megatron-core's DistributedOptimizer restores the iteration count into its
    param groups (``group["step"]``) but not into the per-parameter state torch Adam reads, and
    where it does set per-parameter steps it shares ONE tensor among them, which torch Adam
    increments in place once per parameter. Both skew bias correction after a resume.
    """
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(opt, "optimizer", None)
        for group in (inner.param_groups if inner is not None else ()):
            if "step" not in group:
                continue
            for param in group["params"]:
                inner.state[param]["step"] = torch.tensor(float(group["step"]))


def load_checkpoint(root: str, model, optimizer, scheduler, args=None) -> int:
    """Restores model, optimizer, LR scheduler and RNG states; returns the iteration to continue
    from. With ``args``, refuses a run that would not continue the saved one."""
    iteration, folder = check_checkpoint(root)
    if args is not None:
        _check_run_args(folder, args)
    _materialize_optimizer_state(optimizer)
    template = _sharded_state_dict(model, optimizer, scheduler, iteration, is_loading=True)
    state = dist_checkpointing.load(template, folder)
    if args is not None:
        resume_consistency.check_scheduler(state["opt_param_scheduler"], scheduler, args)
    for key, chunk in zip(_model_keys(model), model):
        unwrap(chunk).load_state_dict(state[key])
    with torch.no_grad():  # megatron-core copies into main-param views of leaves needing grad
        optimizer.load_state_dict(state["optimizer"])
    _restore_adam_steps(optimizer)
    scheduler.load_state_dict(state["opt_param_scheduler"])
    restored = agree_on_errors(rng_state.load, folder)  # a bad file on one rank stops all
    if not restored:
        print_rank_0(f" > {folder}: random states not restored (saved on another parallel "
                     f"layout): dropout will differ from an uninterrupted run")
    return int(state["iteration"])
