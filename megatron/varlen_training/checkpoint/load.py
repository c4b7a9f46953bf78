"""The load path: a checkpoint verified and checked against this run before megatron-core reads
it, then restored as the load options say (the package docstring describes the whole)."""

from __future__ import annotations

import os
import re

import torch
from torch.distributed.checkpoint import CheckpointException

from megatron.core import dist_checkpointing
from megatron.core.dist_checkpointing.core import CheckpointingException
from megatron.varlen_training import load_options
from megatron.varlen_training.checkpoint import (
    integrity, optimizer_nesting, optimizer_state, rng_state, sharding, strategies,
)
from megatron.varlen_training.checkpoint.format import check_saved_format
from megatron.varlen_training.checkpoint.layout import (
    FLOPS_SO_FAR_KEY, TRACKER_FILENAME, checkpoint_dir, model_keys, read_latest_iteration,
    sharded_state_dict,
)
from megatron.varlen_training.checkpoint.parts import (
    parts_to_load, recorded_optimizer, recorded_parts,
)
from megatron.varlen_training.checkpoint.safe_load import (
    COMMON_FILENAME, CONFIG_FILENAME, METADATA_FILENAME, check_common_is_safe, check_config,
    check_metadata_is_safe, shard_files,
)
from megatron.varlen_training.config import RunConfig
from megatron.varlen_training.errors import CheckpointError, agree_on_errors, one_line
from megatron.varlen_training.log import print_rank_0
from megatron.varlen_training.model import unwrap
from megatron.varlen_training.resume import consistency, run_args_record, schedule_check
from megatron.varlen_training.resume.run_args_keys import GLOBAL_BATCH_KEY
from megatron.varlen_training.run_description import in_loop_evaluations

_DETAIL_CHARS = 160
# megatron-core's report of mismatching keys under a raising --dist-ckpt-strictness.
_STRICT_MISMATCH_MARKS = ("Missing keys", "Unexpected keys")
# megatron-core's key of a distributed-optimizer bucket's state (dp_reshardable), and the global
# shape mismatch torch_dist reports when this run's bucket differs from the saved one.
_OPTIMIZER_BUCKET_KEY = re.compile(r"optimizer\.distributed\.[^\n]*?bucket_idx_(\d+)")
_SHAPE_MISMATCH = re.compile(r"loaded \(torch\.Size\(\[(\d+)\]\)\) and expected \(\((\d+),\)\)")


def _saved_run_args(folder: str) -> dict:
    """The checkpoint's run_args.json; empty when missing or unreadable (other checks say so)."""
    try:
        return run_args_record.read_run_args(folder)
    except CheckpointError:
        return {}


def _held_parts(folder: str) -> dict[str, bool]:
    """The parts the checkpoint in ``folder`` says it holds (--no-save-optim/--no-save-rng)."""
    return recorded_parts(_saved_run_args(folder))


def _required_files(entries: dict[str, dict], world_size: int | None,
                    with_rng: bool = True) -> dict[str, str]:
    """The files (name -> why) every checkpoint of this format has, besides the shards
    ``.metadata`` names: megatron-core's and ours, and (``with_rng``: not saved with
    --no-save-rng) one RNG file per saving rank."""
    required = {name: "every checkpoint has one" for name in (
        METADATA_FILENAME, CONFIG_FILENAME, COMMON_FILENAME, run_args_record.RUN_ARGS_FILENAME)}
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
    return run_args_record.consumed_samples(checkpoint_dir(root, iteration), iteration, run)


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
    recorded = agree_on_errors(run_args_record.recorded_valid_samples, folder)
    if recorded is not None:
        return recorded
    training = run.training
    derived = in_loop_evaluations(iteration, training.eval_interval,
                                  training.start_eval_at_iter) \
        * training.eval_iters * training.eval_batch_size
    print_rank_0(f" > {folder} records no {run_args_record.VALID_POSITION_KEY} (saved before "
                 f"it was recorded): validation continues after {derived} samples, derived from "
                 f"iteration {iteration} (// --eval-interval {training.eval_interval} x "
                 f"--eval-iters {training.eval_iters} x --eval-global-batch-size "
                 f"{training.eval_batch_size})")
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
    agree_on_errors(check_saved_format, folder)
    agree_on_errors(_verify_share, folder)  # every file verified before any is parsed
    agree_on_errors(_check_format_files, folder)
    return iteration, folder


def _check_run_args(folder: str, iteration: int, run: RunConfig,
                    parts: load_options.LoadParts) -> None:
    """Refuses a run that would not continue the saved one (``--finetune``: a model of another
    shape), on every rank; rank 0 alone reads the data files for their fingerprints."""
    note = agree_on_errors(consistency.check_run_args, folder, run,
                           torch.distributed.get_rank() == 0, parts)
    if note is not None:
        print_rank_0(f" > {note}")
    if not parts.finetune:  # a fine-tuning run starts its own data stream at sample 0
        position = agree_on_errors(consistency.data_position_note, folder, iteration, run)
        print_rank_0(f" > {position}")


def _restore_optimizer(state: dict, optimizer, scheduler, run: RunConfig | None,
                       saved_batch_size: int | None) -> None:
    """The loaded optimizer state and LR/WD schedule into ``optimizer`` and ``scheduler``;
    ``saved_batch_size``: the checkpoint's --global-batch-size (its run_args.json's)."""
    if run is not None:
        schedule_check.check_scheduler(state["opt_param_scheduler"], scheduler, run,
                                       saved_batch_size)
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
            f"--no-load-optim to load the weights only (a save with "
            f"--dist-ckpt-optim-fully-reshardable does not depend on the buckets)")


def _load_state(template: dict, folder: str, run: RunConfig | None = None,
                common_strategy=None) -> dict:
    """dist_checkpointing's load of ``template`` from ``folder`` (with ``run``: its
    --ckpt-fully-parallel-load and --dist-ckpt-strictness; ``common_strategy``: the common
    state's, None for megatron-core's); a bucket layout the saved distributed optimizer state
    does not fit is one line (megatron-core raises a traceback of torch's CheckpointException,
    a BaseException, on every rank)."""
    options = {} if run is None else {
        "sharded_strategy": strategies.load_strategy(run.checkpoint, folder),
        "strict": run.checkpoint.dist_ckpt_strictness}
    if common_strategy is not None:
        options["common_strategy"] = common_strategy
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


def _parts_held(folder: str, saved: dict, parts: load_options.LoadParts,
                run: RunConfig | None) -> load_options.LoadParts:
    """``parts`` narrowed to what the checkpoint in ``folder`` holds (``saved``: its
    run_args.json), as Megatron-LM's load: no optimizer state to restore (or another
    --optimizer's) is one line on every rank; no random states, none restored."""
    return agree_on_errors(
        parts_to_load, folder, recorded_parts(saved), parts,
        recorded_optimizer(saved),
        None if run is None else run.optimizer.optimizer)


def _flops_so_far(state: dict, folder: str) -> int:
    """The floating-point operations the checkpoint records (Megatron-LM's key); 0, said, for
    one saved before they were recorded (Megatron-LM's default)."""
    if FLOPS_SO_FAR_KEY not in state:
        print_rank_0(f" > {folder} records no {FLOPS_SO_FAR_KEY} (saved before it was "
                     f"recorded): the floating-point operations count from 0")
    return int(state.get(FLOPS_SO_FAR_KEY, 0))


def load_checkpoint(root: str, model, optimizer, scheduler, run: RunConfig | None = None,
                    parts: load_options.LoadParts = load_options.RESUME) -> tuple[int, int]:
    """Restores the model and, as ``parts`` says (Megatron-LM's ``--finetune``,
    ``--no-load-optim``, ``--no-load-rng``), the optimizer and LR scheduler and the RNG states;
    returns the iteration to continue from (0 for ``--finetune``) and the floating-point
    operations trained so far, as Megatron-LM's ``load_checkpoint`` (kept with ``--finetune``
    too, as there). With ``run``, refuses a run that would not continue the saved one
    (``--finetune``: a model of another shape)."""
    iteration, folder = check_checkpoint(root, parts.step)
    saved = agree_on_errors(_saved_run_args, folder)
    parts = _parts_held(folder, saved, parts, run)
    if run is not None:
        _check_run_args(folder, iteration, run, parts)
    if parts.optimizer:
        optimizer_state.materialize(optimizer)
    stored = agree_on_errors(dist_checkpointing.load_content_metadata, folder)
    print_rank_0(f"sharded_state_dict metadata loaded from the checkpoint: {stored}")  # Megatron-LM
    metadata = sharding.load_metadata(stored)
    template = sharded_state_dict(model, optimizer, scheduler, iteration, is_loading=True,
                                  metadata=metadata, with_optimizer=parts.optimizer)
    # EP 1 <-> > 1: the saved common optimizer state in this run's nesting (one optimizer or
    # the dense and expert chain), before megatron-core merges the loaded tensors into it.
    common = agree_on_errors(optimizer_nesting.converting_strategy, folder, optimizer,
                             metadata) if parts.optimizer else None
    if common is not None:
        print_rank_0(f" > {folder}: optimizer state saved at another expert parallelism "
                     f"(1 <-> > 1): its param groups converted to this run's optimizers")
    state = _load_state(template, folder, run, common)
    for key, chunk in zip(model_keys(model), model):
        unwrap(chunk).load_state_dict(state[key])
    if parts.optimizer:
        _restore_optimizer(state, optimizer, scheduler, run, saved.get(GLOBAL_BATCH_KEY))
    else:  # the optimizer's fp32 main copy of half-precision weights follows the loaded weights
        optimizer.reload_model_params()
    _restore_rng(folder, parts)
    flops = _flops_so_far(state, folder)
    if parts.finetune:
        print_rank_0(f" > fine-tuning from {folder}: model weights only, starting at iteration 0")
        return 0, flops
    return int(state["iteration"]), flops
