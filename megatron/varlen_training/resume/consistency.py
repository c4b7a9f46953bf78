"""A resumed run continues the run it resumes, or says in one line why it cannot.

Every checkpoint holds ``run_args.json``: the settings that shape the model, the data order and
the LR/WD schedule. On ``--load``:

- model shape (layers, sizes, heads, vocabulary and tokenizer, padded vocabulary, ...) must match: a
  change would load weights into a different model. The parallel layout may change
  (dist_checkpointing reshards), except where it changes the model: the padded vocabulary depends
  on ``--make-vocab-size-divisible-by`` x TP.
- data order (``--seed``, the mock length config, ``--split``, the SFT record keys
  ``--sft-messages-key``/``--sft-prompt-key``/``--sft-response-key``, how an SFT file was
  split: a checkpoint from before ``--sft`` honoured ``--split`` used the 5% tail, and with
  ``--rampup-batch-size`` the ramp and ``--global-batch-size``, which sizes it) must match: the
  resumed run would otherwise read other samples than the run it continues. With Megatron
  indexed data also the number of training samples the datasets are built for
  (``--train-iters`` x ``--global-batch-size``, or ``--train-samples``): megatron-core shuffles
  over as many epochs as that count needs, so another count is another sample order (refused
  unless ``--override-data-fingerprint``).
- data position: a checkpoint records the samples consumed (``consumed_train_samples``:
  iteration x global batch in pretrain_gpt.py's loop, the samples of the caller's batches in
  megatron.wrap's); the resumed run continues the stream at that sample, and its LR schedule
  and consumed-samples count from there. Without a ramp-up its batches begin there whatever
  their size (``--global-batch-size`` may change; resumed_batch_anchor.py); with one,
  pretrain_gpt.py refuses a checkpoint whose count is not the ramp's at its iteration (its loop
  reads global batch i at iteration i). It also records
  the validation samples its evaluations read (``consumed_valid_samples``, Megatron-LM's), where
  the resumed run's validation continues (:mod:`~megatron.varlen_training.evaluation`).
- data content: each ``--data-path`` file (and each per-split path) is identified by its
  content, a fingerprint of size and SHA-256 (streamed; computed once per run by rank 0, at
  the first save and at ``--load``; a folder of Parquet shards or a ``save_to_disk`` folder:
  the same for each of its data files, combined; :mod:`data_fingerprints`), not by how its
  path is spelled: ``./x``, ``x`` and ``/abs/x`` (or a copy elsewhere) resume,
  a changed file at the same path is refused unless ``--override-data-fingerprint`` says to
  train on it deliberately (the resumed run then reads the new content from the saved
  position). Cost: one read of each data file, which the SFT reader loads whole anyway. An
  indexed dataset prefix is identified by its .idx file's SHA-256 and its .bin file's size (the
  index holds every document's length and offset; hashing a corpus of terabytes at every
  start would not be affordable); a weight is compared as spelled.
- optimizer layout: the state of ``--use-distributed-optimizer`` (sharded over data-parallel
  ranks) and of the plain optimizer (per parameter) are stored differently and not converted:
  toggling the flag on resume is refused. Expert parallelism: megatron-core keeps the experts'
  state in an optimizer of its own only with EP > 1, so EP 1 <-> > 1 changes the nesting of
  the optimizer's common state, which the load converts (not a check here:
  :mod:`~megatron.varlen_training.checkpoint.optimizer_nesting`, which refuses what cannot
  convert: a checkpoint saved before its optimizer format was stored); EP 2 <-> 4
  resumes (the experts' state is resharded by their global index), and so does a changed
  expert tensor parallelism (``--expert-tensor-parallel-size``, ETP 1 <-> 2: the experts'
  weights and state are resharded like TP's). ``--use-distributed-optimizer`` state reshards
  over data-parallel ranks only in megatron-core's default ``dp_reshardable`` format: a
  changed TP, PP, EP (1 <-> > 1 too, refused here before the load would convert anything) or
  ETP size, or another placement of the layers over the pipeline chunks, is refused with it
  (the weights still reshard: ``--no-load-optim`` loads them alone). The placement is
  compared as the decoder layers of each chunk (and the virtual pipeline size) the split flags
  give, so equivalent spellings resume:
  ``--num-layers-per-virtual-pipeline-stage`` or ``--num-virtual-stages-per-pipeline-rank``,
  neither for one virtual stage per rank, a layout string or first/last stage sizes. A checkpoint
  saved with ``--dist-ckpt-optim-fully-reshardable`` records the ``fully_reshardable`` format
  (``distrib_optim_sharding_type``) and follows those changes.
- the LR/WD schedule follows Megatron-LM: a difference between this run's flags and the
  checkpoint's scheduler is refused unless ``--override-opt_param-scheduler`` (this run's
  flags win; the number of samples already consumed is kept) or
  ``--use-checkpoint-opt_param-scheduler`` (the checkpoint's schedule wins) says which side wins.

Recorded for ``--use-checkpoint-args`` only, not compared
(:data:`~run_args_keys.CHECKPOINT_ARGS_KEYS`, :data:`~run_args_keys.MOE_ROUTER_KEYS`): the
dropouts, query-key layer scaling, ``--tokenizer-model``, ``--tiktoken-pattern`` and the MoE
router's flags, which Megatron-LM's ``load_args_from_checkpoint`` takes too.

``--finetune`` starts a new run from the weights: only the model shape is compared (the
position-table size only with learned absolute positions), so fine-tuning on other data, with
another batch size, seed, schedule or optimizer layout is not refused. Without the optimizer
state (``--no-load-optim``) the optimizer layout may change.

Where it lives: the recorded keys in :mod:`.run_args_keys`, writing and reading the record in
:mod:`.run_args_record`, the model/data messages in :mod:`.messages`, the optimizer layout in
:mod:`.optimizer_layout_check`, the data files in :mod:`.data_source_check`, the LR/WD schedule
in :mod:`.schedule_check`; this module compares a resume against the record.

Every refusal is a one-line :class:`CheckpointError` naming the flag and both values; a
garbled ``run_args.json`` is one too.
"""

from __future__ import annotations

from megatron.varlen_training.batch_rampup import GlobalBatchSchedule
from megatron.varlen_training.config import RunConfig
from megatron.varlen_training.document_arguments import PACKING_UNIT_DOCUMENT
from megatron.varlen_training.errors import CheckpointError
from megatron.varlen_training.load_options import RESUME, LoadParts
from megatron.varlen_training.resume.data_source_check import check_data_sources
from megatron.varlen_training.resume.messages import recorded_key_mismatch
from megatron.varlen_training.resume.optimizer_layout_check import (
    decoupled_lr_mismatch, optimizer_layout_mismatch, sharded_optimizer_mismatch,
)
from megatron.varlen_training.resume.run_args_keys import (
    CHECKED_WHEN_RECORDED, DATA_ORDER_KEYS, DATA_POSITION_KEY, GLOBAL_BATCH_KEY,
    INDEXED_SAMPLES_KEY, LEARNED_POSITIONS, MODEL_KEYS, OPTIMIZER_LAYOUT_KEY,
    OVERRIDABLE_DATA_KEYS, RAMPUP_KEY, RECORDED_BEFORE, SFT_SPLIT_RULE_KEY, SFT_SPLIT_TAIL,
    WINDOW_KEYS,
)
from megatron.varlen_training.resume.run_args_record import (
    consumed_samples, normalise, read_run_args, snapshot,
)


def _compared_keys(saved: dict, mine: dict, parts: LoadParts) -> tuple[str, ...]:
    """The keys that must match. A resume: model shape and data order. ``--finetune`` (a new
    run from the weights): the model shape only, and the position-table size only where both
    have a table (learned absolute positions): RoPE fine-tunes at any --seq-length, and with
    any sliding window (the weights are the same)."""
    if not parts.finetune:
        return MODEL_KEYS + DATA_ORDER_KEYS
    tables = {side.get("position_embedding_type") for side in (saved, mine)}
    free = (*WINDOW_KEYS, *(() if tables == {LEARNED_POSITIONS} else ("max_position_embeddings",)))
    return tuple(key for key in MODEL_KEYS if key not in free)


def _batch_size_may_change(saved: dict, mine: dict) -> bool:
    """Neither run ramps its batch up: the resumed run's batches of its own size start at the
    checkpoint's consumed samples (resumed_batch_anchor.py; :func:`data_position_note` checks
    that they do). A ramp's sizes depend on --global-batch-size: with one, it must match."""
    return saved.get(RAMPUP_KEY) is None and mine[RAMPUP_KEY] is None


def _whole_documents(saved: dict, mine: dict) -> bool:
    """Both runs read whole documents of indexed data: sample i depends only on (--seed, i)
    (one dataset's epoch permutations, a blend's prefix-stable blending), not on how many
    samples the run reads, so a longer or shorter run resumes on the same stream."""
    return (saved.get("packing_unit") == mine["packing_unit"] == PACKING_UNIT_DOCUMENT
            and None not in (saved.get(INDEXED_SAMPLES_KEY), mine[INDEXED_SAMPLES_KEY]))


def check_run_args(folder: str, run: RunConfig, check_data: bool = True,
                   parts: LoadParts = RESUME) -> str | None:
    """Refuses a model-shape, optimizer-layout, data-order or data-content change (module
    docstring); ``parts``: what the load restores (``--finetune``: the model shape only; no
    optimizer state: its layout may differ). ``check_data``: compare the data files'
    fingerprints (reads every file: one rank does it). Returns a note to print when a flag
    accepted a difference."""
    recorded = read_run_args(folder)
    saved = {**RECORDED_BEFORE, **recorded}
    mine = snapshot(run, with_data=False)
    # A checkpoint from before the key: an SFT file was split by the tail rule, other data by
    # none (the key's comment).
    saved.setdefault(SFT_SPLIT_RULE_KEY, None if mine[SFT_SPLIT_RULE_KEY] is None
                     else SFT_SPLIT_TAIL)
    note = None
    for key in _compared_keys(saved, mine, parts):
        if normalise(saved.get(key)) == normalise(mine[key]) \
                or (key in CHECKED_WHEN_RECORDED and key not in recorded) \
                or (key == INDEXED_SAMPLES_KEY and _whole_documents(saved, mine)) \
                or (key == GLOBAL_BATCH_KEY and _batch_size_may_change(saved, mine)):
            continue
        if key in OVERRIDABLE_DATA_KEYS and None not in (saved.get(key), mine[key]) \
                and run.checkpoint.override_data_fingerprint:
            note = f"--override-data-fingerprint: {recorded_key_mismatch(key, saved, mine)}"
            continue
        raise CheckpointError(recorded_key_mismatch(key, saved, mine))
    saved_layout = saved.get(OPTIMIZER_LAYOUT_KEY)
    if parts.optimizer and saved_layout is not None \
            and bool(saved_layout) != bool(mine[OPTIMIZER_LAYOUT_KEY]):
        raise CheckpointError(optimizer_layout_mismatch(bool(saved_layout)))
    if parts.optimizer and (problem := sharded_optimizer_mismatch(saved, mine)
                            or decoupled_lr_mismatch(saved, mine, run.optimizer)):
        raise CheckpointError(problem)
    if check_data and not parts.finetune and mine["data_entries"] is not None:
        return check_data_sources(saved, run) or note  # None: megatron.wrap's own batches
    return note


def data_position_note(folder: str, iteration: int, run: RunConfig) -> str:
    """Where the resumed run continues its training samples; a one-line CheckpointError when
    the checkpoint's recorded position is not where this run's loop reads global batch
    ``iteration`` (a ramp-up's position, or a record the flag layer could not anchor at)."""
    if run.training.runtime_batches:  # the caller's loop brings the data: any count is a count
        return (f"resuming after {consumed_samples(folder, iteration, run)} consumed training "
                f"samples (iteration {iteration})")
    position = GlobalBatchSchedule.of(run.training).first_sample(iteration)
    record = read_run_args(folder)
    saved = record.get(DATA_POSITION_KEY)
    batches = _batches_text(run.training, iteration)
    if saved is not None and saved != position:
        raise CheckpointError(
            f"--load: {folder} records {saved} consumed training samples but {batches} is "
            f"{position}: it was trained on batches of other sizes (megatron.wrap) or its "
            f"files do not belong together; load another checkpoint, or pass --finetune to "
            f"start from its weights")
    gbs, saved_gbs = run.training.global_batch_size, record.get(GLOBAL_BATCH_KEY)
    if saved_gbs is not None and saved_gbs != gbs:
        return (f"resuming the training data at sample {position}, the checkpoint's consumed "
                f"samples, with --global-batch-size {gbs} (the checkpoint's run trained "
                f"{saved_gbs})")
    if run.training.rampup_batch_size is None and position != iteration * gbs:
        return (f"resuming the training data at sample {position}, the checkpoint's consumed "
                f"samples (its run trained batches of other sizes before)")
    return (f"resuming the training data at sample {position} "
            f"({_batches_text(run.training, iteration, note=True)})")


def _batches_text(training, iteration: int, note: bool = False) -> str:
    """How the samples before ``iteration`` are counted, for the messages (``note``: the
    resume note's wording)."""
    if training.rampup_batch_size is not None:
        ramp = " ".join(str(value) for value in training.rampup_batch_size)
        return f"iteration {iteration} of --rampup-batch-size {ramp}"
    flag = "global batch" if note else "--global-batch-size"
    return f"iteration {iteration} x {flag} {training.global_batch_size}"
