"""Save and resume with megatron-core dist_checkpointing (torch_dist format): this package's
names below are the API the trainer, the facade and the tools use. The work is split by
responsibility: what a checkpoint is (:mod:`.layout`), the save path (:mod:`.save`), the load
path (:mod:`.load`), the optimizer state's format (:mod:`.sharding`), its common state
converted between expert parallelism 1 and > 1 (:mod:`.optimizer_nesting`) and its restore
(:mod:`.optimizer_state`); whether the run continues the saved one is
:mod:`megatron.varlen_training.resume`'s.

Layout (Megatron-LM's): ``<dir>/iter_0000003/`` holds one checkpoint and
``<dir>/latest_checkpointed_iteration.txt`` names the newest. The iteration in the directory
name is the number of iterations completed, i.e. the one the last log line printed.
The optimizer state's layout (the distributed optimizer's ``dp_reshardable`` or, with
``--dist-ckpt-optim-fully-reshardable``, ``fully_reshardable`` format) is stored as
megatron-core's content metadata and a load reads it back (:mod:`.sharding`).

Besides megatron-core's files, each checkpoint holds ``manifest.json`` (size and SHA-256 of
every file), ``run_args.json`` (what shapes the model, data order and schedule) and
``rng/rank_NNNNN.pt`` (each rank's generator states;
not with ``--no-save-rng``: :mod:`.parts`). Saving writes a hidden staging folder and
publishes it with one rename, then replaces the tracker atomically
(:mod:`~megatron.varlen_training.checkpoint.integrity`). Loading checks, before megatron-core reads
anything: the tracker, the folder, that the manifest lists every file in it and every file the
format needs, every file against the manifest, that ``.metadata`` holds only
checkpoint-metadata classes and that the small files are well-formed
(:mod:`~megatron.varlen_training.checkpoint.safe_load`), and that the run continues the saved one
(:mod:`~megatron.varlen_training.resume.consistency`); a folder in another format is refused
first (:mod:`~megatron.varlen_training.checkpoint.format`), and distributed-optimizer state that
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

Names are imported on first use (:mod:`megatron.varlen.lazy_exports`), as the datasets' are:
the modules of this package and of :mod:`megatron.varlen_training.resume` import one another's
pieces without importing the whole save and load paths first.
"""

from megatron.varlen.lazy_exports import lazy_exports

_LAYOUT = "megatron.varlen_training.checkpoint.layout"
_LOAD = "megatron.varlen_training.checkpoint.load"
_SAVE = "megatron.varlen_training.checkpoint.save"
_EXPORTS = {
    "TRACKER_FILENAME": _LAYOUT, "checkpoint_dir": _LAYOUT, "model_keys": _LAYOUT,
    "model_sharded_state_dict": _LAYOUT, "read_latest_iteration": _LAYOUT,
    "check_checkpoint": _LOAD, "consumed_samples_at": _LOAD, "consumed_valid_samples_at": _LOAD,
    "load_checkpoint": _LOAD,
    "CheckpointSaveError": _SAVE, "CheckpointSaveInterrupted": _SAVE, "save_checkpoint": _SAVE,
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
