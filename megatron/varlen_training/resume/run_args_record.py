"""Writes and reads a checkpoint's ``run_args.json`` (the keys: :mod:`.run_args_keys`).

The record is the run's value of each key, taken from the config holding it, plus the data
files' fingerprints, the saved parts, the optimizer's state format and the data position
(the training and validation samples consumed); reading it is a one-line CheckpointError for a
missing or garbled file.
"""

from __future__ import annotations

import argparse
import json
import os

from megatron.varlen_training.batch_rampup import GlobalBatchSchedule
from megatron.varlen_training.checkpoint.integrity import atomic_write_text
from megatron.varlen_training.checkpoint.parts import OPTIMIZER_KEY, SAVED_PARTS_KEY, saved_parts
from megatron.varlen_training.checkpoint.sharding import SHARDING_TYPE_KEY, optimizer_sharding_type
from megatron.varlen_training.config import RunConfig
from megatron.varlen_training.data_fingerprints import data_fingerprint
from megatron.varlen_training.document_arguments import PACKING_UNIT_DOCUMENT
from megatron.varlen_training.errors import CheckpointError, one_line
from megatron.varlen_training.flag_errors import ArgumentValidationError, require
from megatron.varlen_training.moe_arguments import default_dispatcher
from megatron.varlen_training.pipeline_arguments import (
    pipeline_split_of, validate_pipeline_split,
)
from megatron.varlen_training.resume.run_args_keys import (
    CHECKPOINT_ARGS_KEYS, CONTEXT_KEYS, DATA_ORDER_KEYS, DATA_POSITION_KEY, DATA_SOURCES_KEY,
    DECOUPLED_LR_FLAGS, DOCUMENT_PIECE_KEY, EXPERT_PARALLEL_KEY, EXPERT_TENSOR_PARALLEL_KEY,
    HYBRID_KEYS,
    INDEXED_SAMPLES_KEY, MLA_KEYS, MODEL_KEYS, MOE_DISPATCHER_KEY, MOE_KEYS, MOE_ROUTER_KEYS,
    OPTIMIZER_LAYOUT_KEY, PIPELINE_CHUNKS_KEY, PIPELINE_LAYOUT_FLAG_KEYS, PIPELINE_PARALLEL_KEY,
    PIPELINE_SPLIT_KEYS, RAMPUP_KEYS, RUN_ARGS_FILENAME, SFT_KEYS, SFT_SPLIT_BY_SHARES,
    SFT_SPLIT_TAIL, VALID_POSITION_KEY, VIRTUAL_PIPELINE_KEY, VIRTUAL_PIPELINE_SIZE_KEY,
)

# The flags the pipeline split reads, as a record from before one was recorded had them
# (the flag did not exist: its default).
_SPLIT_DEFAULTS = {key: False if key.startswith("account_for") else None
                   for key in PIPELINE_LAYOUT_FLAG_KEYS + ("mtp_num_layers",)}


def data_entries(run: RunConfig) -> list[str] | None:
    """Every data path entry the run reads, as spelled: ``--data-path``, else the per-split
    paths in split order; None without data paths (mock data, megatron.wrap)."""
    data = run.data
    if data.data_path is not None:
        return list(data.data_path)
    lists = [data.train_data_path, data.valid_data_path, data.test_data_path]
    if all(paths is None for paths in lists):
        return None
    return [entry for paths in lists for entry in (paths or ())]


def _sft_split_rule(data) -> str | None:
    """:data:`SFT_SPLIT_RULE_KEY`'s value for the run's data."""
    if not data.sft or data.mock_data:
        return None
    return SFT_SPLIT_BY_SHARES if data.split is not None else SFT_SPLIT_TAIL


def _recorded_values(run: RunConfig) -> dict:
    """The run's value of every key ``run_args.json`` records, from the config holding it."""
    model, hybrid, data = run.model, run.model.hybrid, run.data
    values = {key: getattr(model, key) for key in MODEL_KEYS
              if key not in HYBRID_KEYS + MOE_KEYS + tuple(MLA_KEYS)
              and key != "tokenizer_type"}
    values.update(_mla_values(model.mla))
    values.update({key: getattr(hybrid, key) if hybrid is not None else None
                   for key in HYBRID_KEYS})
    moe = model.moe
    values.update({key: getattr(moe, key) if moe is not None else None for key in MOE_KEYS})
    values[EXPERT_PARALLEL_KEY] = moe.expert_model_parallel_size if moe is not None else 1
    values[EXPERT_TENSOR_PARALLEL_KEY] = moe.expert_tensor_parallel_size if moe is not None \
        else None
    values.update(
        tokenizer_type=data.tokenizer_type,
        use_distributed_optimizer=run.optimizer.use_distributed_optimizer,
        **{key: getattr(run.optimizer, key) for key in DECOUPLED_LR_FLAGS},
        seed=run.training.seed, global_batch_size=run.training.global_batch_size,
        **{key: normalise(getattr(run.training, key)) for key in RAMPUP_KEYS},
        sft_mock_dataset_config_json=data.sft_mock_dataset_config_json,
        split=data.split, data_entries=data_entries(run), packing_unit=data.packing_unit,
        **{DOCUMENT_PIECE_KEY: _document_piece_length(run)},
        sft_split_rule=_sft_split_rule(data),
        **{key: getattr(data, key) for key in SFT_KEYS},
        **{INDEXED_SAMPLES_KEY: data.train_samples if data.indexed else None},
        make_vocab_size_divisible_by=model.make_vocab_size_divisible_by,
        tensor_model_parallel_size=run.parallel.tensor_model_parallel_size,
        pipeline_model_parallel_size=run.parallel.pipeline_model_parallel_size,
        num_layers_per_virtual_pipeline_stage=run.parallel.num_layers_per_virtual_pipeline_stage,
        **{key: getattr(run.parallel, key) for key in PIPELINE_SPLIT_KEYS},
        **{VIRTUAL_PIPELINE_SIZE_KEY: run.parallel.virtual_pipeline_model_parallel_size},
        seq_length=model.seq_length,
        data_path=list(data.data_path) if data.data_path is not None else None)
    values[PIPELINE_CHUNKS_KEY] = pipeline_chunks(values)
    return values


def _document_piece_length(run: RunConfig) -> int | None:
    """With --packing-unit document, the longest piece documents are cut into
    (whole_documents.document_piece_length: --document-piece-length, else the layout's longest
    sequence); None for other data."""
    if not run.data.indexed or run.data.packing_unit != PACKING_UNIT_DOCUMENT:
        return None
    from megatron.varlen_training.datasets.whole_documents import document_piece_length

    return document_piece_length(run)


def pipeline_chunks(record: dict) -> list[list[int]] | None:
    """``[pp_rank][vp_stage]``: the decoder layers of each model chunk, as recorded or, for a
    checkpoint saved before they were, as its recorded flags place them (pipeline_arguments'
    rules, megatron-core's arithmetic); None for a record from before the virtual pipeline flag
    was (its layout is unknown, so not checked)."""
    if PIPELINE_CHUNKS_KEY in record:
        return record[PIPELINE_CHUNKS_KEY]
    if VIRTUAL_PIPELINE_KEY not in record or record.get(PIPELINE_PARALLEL_KEY) is None:
        return None
    args = argparse.Namespace(num_layers=record["num_layers"],
                              pipeline_model_parallel_size=record[PIPELINE_PARALLEL_KEY],
                              **{key: record.get(key, default)
                                 for key, default in _SPLIT_DEFAULTS.items()})
    try:
        validate_pipeline_split(args, require)
    except ArgumentValidationError as err:  # a hand-edited record: say which file
        raise CheckpointError(f"{RUN_ARGS_FILENAME} records a pipeline split that does not "
                              f"validate ({err}); load another checkpoint") from None
    return pipeline_split_of(args).chunk_layers()


def _mla_values(mla) -> dict:
    """The MLA keys' values: the shape of an MLA run, :data:`MLA_KEYS` (no MLA) otherwise."""
    if mla is None:
        return dict(MLA_KEYS)
    return {"multi_latent_attention": True,
            **{key: getattr(mla, key) for key in MLA_KEYS if key != "multi_latent_attention"}}


def _checkpoint_args_values(run: RunConfig) -> dict:
    """The run's value of each :data:`CHECKPOINT_ARGS_KEYS` and :data:`MOE_ROUTER_KEYS` key,
    and of :data:`MOE_DISPATCHER_KEY`."""
    model, data, moe = run.model, run.data, run.model.moe
    values = {key: normalise(getattr(model, key)) for key in CHECKPOINT_ARGS_KEYS
              if hasattr(model, key)}
    values.update({key: getattr(data, key) for key in CHECKPOINT_ARGS_KEYS
                   if hasattr(data, key)})
    values.update({key: getattr(moe, key) if moe is not None else None
                   for key in MOE_ROUTER_KEYS})
    chosen = moe.moe_token_dispatcher_type if moe is not None else None
    values[MOE_DISPATCHER_KEY] = None if chosen == default_dispatcher(
        run.packing.sequence_packing) else chosen
    return values


def snapshot(run: RunConfig, with_data: bool = True) -> dict:
    """What ``run_args.json`` records; ``with_data``: fingerprint the data files (reads them)."""
    values = {**_recorded_values(run), **_checkpoint_args_values(run)}
    keys = MODEL_KEYS + (OPTIMIZER_LAYOUT_KEY, EXPERT_PARALLEL_KEY, EXPERT_TENSOR_PARALLEL_KEY,
                         PIPELINE_PARALLEL_KEY, VIRTUAL_PIPELINE_KEY, VIRTUAL_PIPELINE_SIZE_KEY,
                         PIPELINE_CHUNKS_KEY) + PIPELINE_SPLIT_KEYS \
        + DATA_ORDER_KEYS \
        + CONTEXT_KEYS + tuple(DECOUPLED_LR_FLAGS) + CHECKPOINT_ARGS_KEYS + MOE_ROUTER_KEYS \
        + (MOE_DISPATCHER_KEY,)
    recorded = {key: values[key] for key in keys}
    if with_data and recorded["data_entries"] is not None:
        recorded[DATA_SOURCES_KEY] = [data_fingerprint(entry)
                                      for entry in recorded["data_entries"]]
    return recorded


def save_run_args(folder: str, run: RunConfig, iteration: int | None = None,
                  consumed_samples: int | None = None,
                  consumed_valid_samples: int | None = None) -> str:
    """Writes ``run_args.json``; with ``iteration``, also the data position: the training
    samples consumed so far, ``consumed_samples`` (default: the global batches of the
    iterations before, batch_rampup.py: every iteration of pretrain_gpt.py's loop reads one),
    and the validation samples
    read so far, ``consumed_valid_samples`` (not recorded when None)."""
    recorded = snapshot(run)
    recorded[SAVED_PARTS_KEY] = saved_parts(run.checkpoint)  # --no-save-optim / --no-save-rng
    recorded[OPTIMIZER_KEY] = run.optimizer.optimizer  # whose state it is (checkpoint/parts.py)
    # The distributed optimizer's format (None: the plain optimizer): which layouts it follows.
    recorded[SHARDING_TYPE_KEY] = optimizer_sharding_type(run)
    if iteration is not None:
        recorded[DATA_POSITION_KEY] = consumed_samples if consumed_samples is not None \
            else GlobalBatchSchedule.of(run.training).first_sample(iteration)
        if consumed_valid_samples is not None:
            recorded[VALID_POSITION_KEY] = consumed_valid_samples
    atomic_write_text(os.path.join(folder, RUN_ARGS_FILENAME),
                      json.dumps(recorded, indent=1, sort_keys=True) + "\n")
    return RUN_ARGS_FILENAME


def consumed_samples(folder: str, iteration: int, run: RunConfig) -> int:
    """The training samples the checkpoint in ``folder`` had consumed (module docstring)."""
    saved = read_run_args(folder).get(DATA_POSITION_KEY)
    return GlobalBatchSchedule.of(run.training).first_sample(iteration) if saved is None \
        else int(saved)


def recorded_valid_samples(folder: str) -> int | None:
    """The validation samples the checkpoint in ``folder`` records as read, or None for a
    checkpoint saved before they were recorded; a one-line CheckpointError if the value is not
    a count."""
    saved = read_run_args(folder).get(VALID_POSITION_KEY)
    if saved is None:
        return None
    if isinstance(saved, bool) or not isinstance(saved, int) or saved < 0:
        raise CheckpointError(f"checkpoint {folder!r}: {VALID_POSITION_KEY} in "
                              f"{RUN_ARGS_FILENAME} is {saved!r}, not a sample count; load "
                              f"another checkpoint")
    return saved


def normalise(value):
    """A value as JSON gives it back (a tuple is a list), so a record compares with the run."""
    return list(value) if isinstance(value, tuple) else value


def read_run_args(folder: str) -> dict:
    """The checkpoint's ``run_args.json``, or a one-line CheckpointError naming it."""
    path = os.path.join(folder, RUN_ARGS_FILENAME)
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint {folder!r} has no {RUN_ARGS_FILENAME}: cannot check "
                              f"that this run continues it")
    try:
        with open(path, encoding="utf-8") as handle:
            saved = json.load(handle)
    except (OSError, ValueError) as err:  # ValueError: bad JSON or bad UTF-8
        problem = f"{type(err).__name__}: {one_line(err)[:120]}"
    else:
        sources = saved.get(DATA_SOURCES_KEY) if isinstance(saved, dict) else None
        problem = ("not a JSON object" if not isinstance(saved, dict) else
                   f"{DATA_SOURCES_KEY} is not a list of objects"
                   if sources is not None and not (isinstance(sources, list) and all(
                       isinstance(source, dict) for source in sources)) else None)
    if problem is not None:
        raise CheckpointError(f"checkpoint file {path!r} is unreadable ({problem}); load "
                              f"another checkpoint")
    return saved
