"""Whether the saved optimizer state can follow this run's layout, or why not in one line.

Toggling ``--use-distributed-optimizer`` and ``--decoupled-lr`` on <-> off change the state's
layout; the distributed optimizer's default ``dp_reshardable`` format also cannot follow a
model-parallel change, expert parallelism 1 <-> > 1 included (the module docstring of
:mod:`~megatron.varlen_training.resume.consistency` has the rules). Expert parallelism 1 <-> > 1
otherwise changes only how the common state is nested, which the load converts
(:mod:`~megatron.varlen_training.checkpoint.optimizer_nesting`).
"""

from __future__ import annotations

from megatron.varlen_training.checkpoint.sharding import (
    DP_RESHARDABLE, FULLY_RESHARDABLE, SHARDING_TYPE_KEY,
)
from megatron.varlen_training.resume.run_args_keys import (
    DECOUPLED_LR_FLAGS, OPTIMIZER_LAYOUT_KEY, PIPELINE_CHUNKS_KEY,
    PIPELINE_LAYOUT_FLAG_KEYS, SHARDED_OPTIMIZER_SIZES,
)
from megatron.varlen_training.resume.run_args_record import pipeline_chunks


def sharded_optimizer_mismatch(saved: dict, mine: dict) -> str | None:
    """Why --use-distributed-optimizer's state cannot follow a model-parallel size change, or
    None (:data:`SHARDED_OPTIMIZER_SIZES`). A checkpoint saved in megatron-core's
    ``fully_reshardable`` format (``--dist-ckpt-optim-fully-reshardable``) follows every one of
    them; the ``dp_reshardable`` one (the default, and every checkpoint saved before the format
    was recorded) only data parallelism: unchecked, megatron-core stops every rank with a
    KeyError for the state of data-parallel groups the checkpoint does not have, or, for a
    virtual pipeline or expert tensor parallel change, a global-shape CheckpointingException.
    The pipeline split is compared as the layout it gives (:func:`_pipeline_layout_mismatch`).
    Checkpoints saved before a size was recorded are not checked for it (their run_args.json
    lacks the key; RECORDED_BEFORE has no value for it, since an old run's ETP is unknown)."""
    if not mine[OPTIMIZER_LAYOUT_KEY] \
            or saved.get(SHARDING_TYPE_KEY, DP_RESHARDABLE) == FULLY_RESHARDABLE:
        return None
    for key, flag in SHARDED_OPTIMIZER_SIZES.items():
        if key not in PIPELINE_LAYOUT_FLAG_KEYS and key in saved and saved[key] != mine[key]:
            return _sharded_message(flag, saved[key], mine[key])
    return _pipeline_layout_mismatch(saved, mine)


def _pipeline_layout_mismatch(saved: dict, mine: dict) -> str | None:
    """Why the state cannot follow another placement of the layers over the pipeline (virtual)
    stages, or None where each model chunk holds the same layers however the flags spelled it
    (``--num-layers-per-virtual-pipeline-stage`` or ``--num-virtual-stages-per-pipeline-rank``;
    neither for one virtual stage per rank; a layout string or first/last stage sizes): the
    buffers are the chunks'. Named by the first of the flags that differs."""
    saved_chunks = pipeline_chunks(saved)
    if saved_chunks is None or saved_chunks == mine[PIPELINE_CHUNKS_KEY]:
        return None
    for key in PIPELINE_LAYOUT_FLAG_KEYS:
        if saved.get(key, mine[key]) != mine[key]:
            return _sharded_message(SHARDED_OPTIMIZER_SIZES[key], saved[key], mine[key])
    return _sharded_message("decoder layers per pipeline chunk", saved_chunks,
                            mine[PIPELINE_CHUNKS_KEY])


def _sharded_message(flag: str, saved, mine) -> str:
    return (f"--load: the checkpoint's distributed optimizer state was saved "
            f"{_with_flag(flag, saved)}, this run has {_value(mine)}: its "
            f"format (megatron-core's {DP_RESHARDABLE}) reshards over data-parallel "
            f"ranks only (resume {_with_flag(flag, saved)}, or add --no-load-optim "
            f"to load the weights only; a save with "
            f"--dist-ckpt-optim-fully-reshardable is resumable at another layout)")


def decoupled_lr_mismatch(saved: dict, mine: dict, optimizer) -> str | None:
    """Why the optimizer state cannot follow a --decoupled-lr change, or None: on or off
    changes its param groups; another value is a schedule change, which needs the flag saying
    which side wins, as --lr's does (schedule_check.check_scheduler)."""
    flag = DECOUPLED_LR_FLAGS["decoupled_lr"]
    if (saved.get("decoupled_lr") is None) != (mine["decoupled_lr"] is None):
        return (f"--load: the checkpoint's optimizer state was saved "
                f"{_with_flag(flag, saved.get('decoupled_lr'))}, this run has "
                f"{_value(mine['decoupled_lr'])}: the embedding and output layer then have a "
                f"param group of their own, so the states differ in layout (resume "
                f"{_with_flag(flag, saved.get('decoupled_lr'))}, or add --no-load-optim to load "
                f"the weights only)")
    if optimizer.override_opt_param_scheduler or optimizer.use_checkpoint_opt_param_scheduler:
        return None
    for key, name in DECOUPLED_LR_FLAGS.items():
        if saved.get(key) != mine[key]:
            return (f"--load: the checkpoint's schedule has {name} {_value(saved.get(key))}, "
                    f"this run has {_value(mine[key])}; pass --override-opt_param-scheduler to "
                    f"use this run's value or --use-checkpoint-opt_param-scheduler to keep the "
                    f"checkpoint's")
    return None


def _with_flag(flag: str, value) -> str:
    return f"without {flag}" if value is None else f"with {flag} {value}"


def _value(value) -> str:
    return "none" if value is None else str(value)


def optimizer_layout_mismatch(saved_distributed: bool) -> str:
    def setting(distributed: bool) -> str:
        return ("with --use-distributed-optimizer (state sharded over data-parallel ranks)"
                if distributed else "without --use-distributed-optimizer (state per parameter)")
    return (f"--load: the checkpoint's optimizer state was saved {setting(saved_distributed)}, "
            f"this run is {setting(not saved_distributed)}: the two layouts are not converted; "
            f"{'add' if saved_distributed else 'remove'} --use-distributed-optimizer to resume")
