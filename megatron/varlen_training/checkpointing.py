"""Save and resume with megatron-core dist_checkpointing (torch_dist format): the API the
trainer, the facade and the tools use. The work is split by responsibility: what a checkpoint
is (:mod:`checkpoint_layout`), the save path (:mod:`checkpoint_save`), the load path
(:mod:`checkpoint_load`), the optimizer state's format (:mod:`checkpoint_sharding`) and its
restore (:mod:`checkpoint_optimizer_state`).

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

from megatron.varlen_training.checkpoint_layout import (
    TRACKER_FILENAME, checkpoint_dir, model_keys, model_sharded_state_dict, read_latest_iteration,
)
from megatron.varlen_training.checkpoint_load import (
    check_checkpoint, consumed_samples_at, consumed_valid_samples_at, load_checkpoint,
)
from megatron.varlen_training.checkpoint_save import (
    CheckpointSaveError, CheckpointSaveInterrupted, save_checkpoint,
)

__all__ = ["TRACKER_FILENAME", "CheckpointSaveError", "CheckpointSaveInterrupted",
           "check_checkpoint", "checkpoint_dir", "consumed_samples_at",
           "consumed_valid_samples_at", "load_checkpoint", "model_keys",
           "model_sharded_state_dict", "read_latest_iteration", "save_checkpoint"]
