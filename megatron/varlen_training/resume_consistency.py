"""A resumed run continues the run it resumes, or says in one line why it cannot.

Every checkpoint holds ``run_args.json``: the settings that shape the model, the data order and
the LR/WD schedule. On ``--load``:

- model shape (layers, sizes, heads, vocabulary and tokenizer, padded vocabulary, ...) must match: a change
  would load weights into a different model. The parallel layout may change (dist_checkpointing
  reshards), except where it changes the model: the padded vocabulary depends on
  ``--make-vocab-size-divisible-by`` x TP.
- data order (``--seed``, ``--global-batch-size``, the mock length config, ``--split``, the
  SFT record keys ``--sft-messages-key``/``--sft-prompt-key``/``--sft-response-key``, and how
  an SFT file was split: a checkpoint from before ``--sft`` honoured ``--split`` used the 5%
  tail) must match: the resumed run would otherwise read other samples than the run it continues. With
  Megatron indexed data also the number of training samples the datasets are built for
  (``--train-iters`` x ``--global-batch-size``): megatron-core shuffles over as many epochs as
  that count needs, so another count is another sample order (refused unless
  ``--override-data-fingerprint``).
- data position: a checkpoint records the samples consumed (``consumed_train_samples``:
  iteration x global batch in pretrain_gpt.py's loop, the samples of the caller's batches in
  megatron.wrap's); the resumed run continues the stream at that sample, and its LR schedule
  and consumed-samples count from there. pretrain_gpt.py refuses a checkpoint whose count is
  not iteration x global batch (its loop reads global batch i at iteration i). It also records
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
  state in an optimizer of its own only with EP > 1, so EP 1 <-> > 1 is refused; EP 2 <-> 4
  resumes (the experts' state is resharded by their global index), and so does a changed
  expert tensor parallelism (``--expert-tensor-parallel-size``, ETP 1 <-> 2: the experts'
  weights and state are resharded like TP's). ``--use-distributed-optimizer`` state reshards
  over data-parallel ranks only in megatron-core's default ``dp_reshardable`` format: a
  changed TP, PP, EP, ETP or virtual pipeline (``--num-layers-per-virtual-pipeline-stage``)
  layout is refused with it (the weights still reshard: ``--no-load-optim`` loads them
  alone). A checkpoint saved with ``--dist-ckpt-optim-fully-reshardable`` records the
  ``fully_reshardable`` format (``distrib_optim_sharding_type``) and follows those changes.
- the LR/WD schedule follows Megatron-LM: a difference between this run's flags and the
  checkpoint's scheduler is refused unless ``--override-opt_param-scheduler`` (this run's
  flags win; the number of samples already consumed is kept) or
  ``--use-checkpoint-opt_param-scheduler`` (the checkpoint's schedule wins) says which side wins.

Recorded for ``--use-checkpoint-args`` only, not compared (:data:`CHECKPOINT_ARGS_KEYS`,
:data:`MOE_ROUTER_KEYS`): the dropouts, query-key layer scaling, ``--tokenizer-model``,
``--tiktoken-pattern`` and the MoE router's flags, which Megatron-LM's
``load_args_from_checkpoint`` takes too.

``--finetune`` starts a new run from the weights: only the model shape is compared (the
position-table size only with learned absolute positions), so fine-tuning on other data, with
another batch size, seed, schedule or optimizer layout is not refused. Without the optimizer
state (``--no-load-optim``) the optimizer layout may change.

Every refusal is a one-line :class:`CheckpointError` naming the flag and both values; a
garbled ``run_args.json`` is one too.
"""

from __future__ import annotations

import json
import os

from megatron.varlen_training.batch_rampup import GlobalBatchSchedule
from megatron.varlen_training.checkpoint_integrity import HASH_ALGORITHM, atomic_write_text
from megatron.varlen_training.checkpoint_parts import OPTIMIZER_KEY, SAVED_PARTS_KEY, saved_parts
from megatron.varlen_training.checkpoint_sharding import (
    DP_RESHARDABLE, FULLY_RESHARDABLE, SHARDING_TYPE_KEY, optimizer_sharding_type,
)
from megatron.varlen_training.data_fingerprints import changed_file, data_fingerprint
from megatron.varlen_training.config import RunConfig
from megatron.varlen_training.errors import CheckpointError, one_line
from megatron.varlen_training.load_options import RESUME, LoadParts

RUN_ARGS_FILENAME = "run_args.json"
LEARNED_POSITIONS = "learned_absolute"  # the one position encoding with a table of weights
# Keys are the flags' dests, which are also the names of the config fields recorded.
_HYBRID_KEYS = ("hybrid_override_pattern", "hybrid_attention_ratio", "hybrid_mlp_ratio",
                "mamba_state_dim", "mamba_head_dim", "mamba_num_groups", "mamba_num_heads")
# MoE model shape (moe_arguments.py): a dense run records None, so it never matches an MoE one.
_MOE_KEYS = ("num_experts", "moe_router_topk", "moe_ffn_hidden_size",
             "moe_shared_expert_intermediate_size", "moe_layer_freq")
# Megatron-LM's partial / interpolated RoPE (model_arguments.py) and their values before.
_ROPE_KEYS = {"rotary_percent": 1.0, "rotary_seq_len_interpolation_factor": None}
_NORM_KEYS = {"layernorm_zero_centered_gamma": False}
# Multi-latent attention's shape and RoPE (mla_arguments.py); checkpoints from before had none.
_MLA_KEYS = {"multi_latent_attention": False, "q_lora_rank": None, "kv_lora_rank": None,
             "qk_head_dim": None, "qk_pos_emb_head_dim": None, "v_head_dim": None,
             "rope_type": None, "rotary_scaling_factor": None, "mscale": None,
             "mscale_all_dim": None}
# Keys recorded under a dest that is not their flag's name (Megatron-LM's dests).
_FLAG_OF_KEY = {"layernorm_zero_centered_gamma": "--apply-layernorm-1p"}
MODEL_KEYS = (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
    "max_position_embeddings", "position_embedding_type", "rotary_base", "normalization",
    "swiglu", "disable_bias_linear", "untie_embeddings_and_output_weights", "mtp_num_layers",
    "padded_vocab_size", "vocab_size", "tokenizer_type", "bf16", "fp16",
    # Hugging Face families (--hf-checkpoint) and hybrid models (pretrain_mamba.py): a GPT run
    # records None for the hybrid keys, so a GPT checkpoint never matches a hybrid run.
    "kv_channels", "norm_epsilon", "add_qkv_bias", "qk_layernorm", "use_rope_scaling",
    "rope_scaling_factor", *_HYBRID_KEYS, *_MOE_KEYS,
    # Megatron-LM's RoPE flags (model_arguments.py).
    *_ROPE_KEYS,
    # --apply-layernorm-1p: the norm weights mean gamma - 1 instead of gamma.
    *_NORM_KEYS,
    # --multi-latent-attention: a standard run records False and None for the rest.
    *_MLA_KEYS,
)
INDEXED_SAMPLES_KEY = "indexed_train_samples"  # training samples indexed data was built for
# Where SFT records keep their text (the dataset and megatron.wrap's gpt_sft flow read them):
# another key reads other fields of the same records.
SFT_KEYS = {"sft_messages_key": "messages", "sft_prompt_key": "prompt",
            "sft_response_key": "response"}
# How a real SFT file's samples were split into training and validation: by --split's shares,
# or the last 5% validate (the only rule before --sft honoured --split: a checkpoint without
# this key that trained on an SFT file used it, whatever --split it recorded). None: no SFT file.
SFT_SPLIT_RULE_KEY = "sft_split_rule"
SFT_SPLIT_BY_SHARES, SFT_SPLIT_TAIL = "split", "tail"
# --rampup-batch-size and its rounding decide which samples each iteration reads.
_RAMPUP_KEYS = {"rampup_batch_size": None, "decrease_batch_size_if_needed": False}
DATA_ORDER_KEYS = ("seed", "global_batch_size", "sft_mock_dataset_config_json", "split",
                   INDEXED_SAMPLES_KEY, "packing_unit", *SFT_KEYS, SFT_SPLIT_RULE_KEY,
                   *_RAMPUP_KEYS)
# Keys added after checkpoints were written without them: the value those checkpoints had.
RECORDED_BEFORE = {"packing_unit": "sample", **SFT_KEYS, **_ROPE_KEYS, **_NORM_KEYS,
                   **_MLA_KEYS, **_RAMPUP_KEYS}
DATA_POSITION_KEY = "consumed_train_samples"  # samples read when the checkpoint was saved
# Validation samples the run's evaluations had read (Megatron-LM's ``consumed_valid_samples``):
# the resumed run's next evaluation continues the validation stream there.
VALID_POSITION_KEY = "consumed_valid_samples"
OPTIMIZER_LAYOUT_KEY = "use_distributed_optimizer"
# With expert parallelism megatron-core keeps the experts' optimizer state in an optimizer of
# its own (a chained optimizer): EP 1 and EP > 1 checkpoints have different optimizer layouts.
EXPERT_PARALLEL_KEY = "expert_model_parallel_size"
EXPERT_TENSOR_PARALLEL_KEY = "expert_tensor_parallel_size"  # None: a dense model (no experts)
PIPELINE_PARALLEL_KEY = "pipeline_model_parallel_size"
VIRTUAL_PIPELINE_KEY = "num_layers_per_virtual_pipeline_stage"  # None: no virtual stages
# Megatron-LM's pipeline split flags (pipeline_arguments.py): which layers each stage holds.
PIPELINE_SPLIT_KEYS = ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
                       "account_for_embedding_in_pipeline_split",
                       "account_for_loss_in_pipeline_split", "num_virtual_stages_per_pipeline_rank",
                       "pipeline_model_parallel_layout")
# The sizes --use-distributed-optimizer's state (megatron-core's dp_reshardable format: one shard
# per data-parallel group of buffers) cannot change: only data parallelism reshards it.
SHARDED_OPTIMIZER_SIZES = {"tensor_model_parallel_size": "--tensor-model-parallel-size",
                           PIPELINE_PARALLEL_KEY: "--pipeline-model-parallel-size",
                           EXPERT_PARALLEL_KEY: "--expert-model-parallel-size",
                           EXPERT_TENSOR_PARALLEL_KEY: "--expert-tensor-parallel-size",
                           VIRTUAL_PIPELINE_KEY: "--num-layers-per-virtual-pipeline-stage",
                           **{key: "--" + key.replace("_", "-") for key in PIPELINE_SPLIT_KEYS}}
# --decoupled-lr gives the embedding and output weights an optimizer param group of their own:
# with and without it the optimizer states differ in layout; the pair's values are the bounds
# of that group's schedule, which its state carries (training.load_state). Checkpoints from
# before these keys had no decoupled LR (the flag did not exist): missing means None.
DECOUPLED_LR_FLAGS = {"decoupled_lr": "--decoupled-lr", "decoupled_min_lr": "--decoupled-min-lr"}
DATA_SOURCES_KEY = "data_sources"  # one fingerprint per --data-path entry (data_fingerprint)
# Recorded for messages, not compared: the padded vocabulary's inputs (it is derived, not a
# flag), --seq-length (which --max-position-embeddings follows unless given) and --data-path
# as spelled (the fingerprints are compared).
_CONTEXT_KEYS = ("make_vocab_size_divisible_by", "tensor_model_parallel_size", "seq_length",
                 "data_path", "data_entries")
# Recorded for --use-checkpoint-args (checkpoint_model_flags.py: what Megatron-LM's
# load_args_from_checkpoint takes besides the model shape), not compared: a resume may change
# the dropouts or the tokenizer file's location. MoE router keys are None for a dense run.
CHECKPOINT_ARGS_KEYS = ("hidden_dropout", "attention_dropout", "apply_query_key_layer_scaling",
                        "tokenizer_model", "tiktoken_pattern")
MOE_ROUTER_KEYS = ("moe_router_pre_softmax", "moe_router_score_function",
                   "moe_router_enable_expert_bias", "moe_router_topk_scaling_factor")
_SHORT_HASH = 12  # hex digits of a data fingerprint shown in messages
# megatron-core scheduler state key -> (this run's flag, scheduler attribute, samples per unit)
SCHEDULER_KEYS = {
    "max_lr": ("--lr", "max_lr", False),
    "min_lr": ("--min-lr", "min_lr", False),
    "lr_warmup_steps": ("--lr-warmup-iters", "lr_warmup_steps", True),
    "lr_decay_steps": ("--lr-decay-iters (default --train-iters)", "lr_decay_steps", True),
    "lr_decay_style": ("--lr-decay-style", "lr_decay_style", False),
    "start_wd": ("--weight-decay (or --start-weight-decay)", "start_wd", False),
    "end_wd": ("--weight-decay (or --end-weight-decay)", "end_wd", False),
    "wd_incr_style": ("--weight-decay-incr-style", "wd_incr_style", False),
    # Only a ramp has a length: constant weight decay ignores it (RAMP_ONLY_KEYS).
    "wd_incr_steps": ("the weight-decay ramp over --train-iters", "wd_incr_steps", True),
}
RAMP_ONLY_KEYS = ("wd_incr_steps",)
# The same lengths in a sample-based run (--train-samples), named and shown in samples.
SAMPLE_BASED_FLAGS = {
    "lr_warmup_steps": "--lr-warmup-samples",
    "lr_decay_steps": "--lr-decay-samples (default --train-samples)",
    "wd_incr_steps": "the weight-decay ramp over --train-samples",
}


def _flag(key: str) -> str:
    return _FLAG_OF_KEY.get(key, "--" + key.replace("_", "-"))


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
              if key not in _HYBRID_KEYS + _MOE_KEYS + tuple(_MLA_KEYS)
              and key != "tokenizer_type"}
    values.update(_mla_values(model.mla))
    values.update({key: getattr(hybrid, key) if hybrid is not None else None
                   for key in _HYBRID_KEYS})
    moe = model.moe
    values.update({key: getattr(moe, key) if moe is not None else None for key in _MOE_KEYS})
    values[EXPERT_PARALLEL_KEY] = moe.expert_model_parallel_size if moe is not None else 1
    values[EXPERT_TENSOR_PARALLEL_KEY] = moe.expert_tensor_parallel_size if moe is not None \
        else None
    values.update(
        tokenizer_type=data.tokenizer_type,
        use_distributed_optimizer=run.optimizer.use_distributed_optimizer,
        **{key: getattr(run.optimizer, key) for key in DECOUPLED_LR_FLAGS},
        seed=run.training.seed, global_batch_size=run.training.global_batch_size,
        **{key: _normalise(getattr(run.training, key)) for key in _RAMPUP_KEYS},
        sft_mock_dataset_config_json=data.sft_mock_dataset_config_json,
        split=data.split, data_entries=data_entries(run), packing_unit=data.packing_unit,
        sft_split_rule=_sft_split_rule(data),
        **{key: getattr(data, key) for key in SFT_KEYS},
        **{INDEXED_SAMPLES_KEY: data.train_samples if data.indexed else None},
        make_vocab_size_divisible_by=model.make_vocab_size_divisible_by,
        tensor_model_parallel_size=run.parallel.tensor_model_parallel_size,
        pipeline_model_parallel_size=run.parallel.pipeline_model_parallel_size,
        num_layers_per_virtual_pipeline_stage=run.parallel.num_layers_per_virtual_pipeline_stage,
        **{key: getattr(run.parallel, key) for key in PIPELINE_SPLIT_KEYS},
        seq_length=model.seq_length,
        data_path=list(data.data_path) if data.data_path is not None else None)
    return values


def _mla_values(mla) -> dict:
    """The MLA keys' values: the shape of an MLA run, :data:`_MLA_KEYS` (no MLA) otherwise."""
    if mla is None:
        return dict(_MLA_KEYS)
    return {"multi_latent_attention": True,
            **{key: getattr(mla, key) for key in _MLA_KEYS if key != "multi_latent_attention"}}


def _checkpoint_args_values(run: RunConfig) -> dict:
    """The run's value of each :data:`CHECKPOINT_ARGS_KEYS` and :data:`MOE_ROUTER_KEYS` key."""
    model, data, moe = run.model, run.data, run.model.moe
    values = {key: getattr(model, key) for key in CHECKPOINT_ARGS_KEYS if hasattr(model, key)}
    values.update({key: getattr(data, key) for key in CHECKPOINT_ARGS_KEYS
                   if hasattr(data, key)})
    values.update({key: getattr(moe, key) if moe is not None else None
                   for key in MOE_ROUTER_KEYS})
    return values


def snapshot(run: RunConfig, with_data: bool = True) -> dict:
    """What ``run_args.json`` records; ``with_data``: fingerprint the data files (reads them)."""
    values = {**_recorded_values(run), **_checkpoint_args_values(run)}
    keys = MODEL_KEYS + (OPTIMIZER_LAYOUT_KEY, EXPERT_PARALLEL_KEY, EXPERT_TENSOR_PARALLEL_KEY,
                         PIPELINE_PARALLEL_KEY, VIRTUAL_PIPELINE_KEY) + PIPELINE_SPLIT_KEYS \
        + DATA_ORDER_KEYS \
        + _CONTEXT_KEYS + tuple(DECOUPLED_LR_FLAGS) + CHECKPOINT_ARGS_KEYS + MOE_ROUTER_KEYS
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
    recorded[OPTIMIZER_KEY] = run.optimizer.optimizer  # whose state it is (checkpoint_parts.py)
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


def data_position_note(folder: str, iteration: int, run: RunConfig) -> str:
    """Where the resumed run continues its training samples; a one-line CheckpointError when
    the checkpoint's recorded position disagrees with its iteration in a run whose loop reads
    global batch i at iteration i (a mixed-up folder, or megatron.wrap's runtime batches)."""
    if run.training.runtime_batches:  # the caller's loop brings the data: any count is a count
        return (f"resuming after {consumed_samples(folder, iteration, run)} consumed training "
                f"samples (iteration {iteration})")
    position = GlobalBatchSchedule.of(run.training).first_sample(iteration)
    saved = read_run_args(folder).get(DATA_POSITION_KEY)
    batches = _batches_text(run.training, iteration)
    if saved is not None and saved != position:
        raise CheckpointError(
            f"--load: {folder} records {saved} consumed training samples but {batches} is "
            f"{position}: it was trained on batches of other sizes (megatron.wrap) or its "
            f"files do not belong together; load another checkpoint, or pass --finetune to "
            f"start from its weights")
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


def _normalise(value):
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


def _compared_keys(saved: dict, mine: dict, parts: LoadParts) -> tuple[str, ...]:
    """The keys that must match. A resume: model shape and data order. ``--finetune`` (a new
    run from the weights): the model shape only, and the position-table size only where both
    have a table (learned absolute positions): RoPE fine-tunes at any --seq-length."""
    if not parts.finetune:
        return MODEL_KEYS + DATA_ORDER_KEYS
    tables = {side.get("position_embedding_type") for side in (saved, mine)}
    if tables == {LEARNED_POSITIONS}:
        return MODEL_KEYS
    return tuple(key for key in MODEL_KEYS if key != "max_position_embeddings")


def check_run_args(folder: str, run: RunConfig, check_data: bool = True,
                   parts: LoadParts = RESUME) -> str | None:
    """Refuses a model-shape, optimizer-layout, data-order or data-content change (module
    docstring); ``parts``: what the load restores (``--finetune``: the model shape only; no
    optimizer state: its layout may differ). ``check_data``: compare the data files'
    fingerprints (reads every file: one rank does it). Returns a note to print when a flag
    accepted a difference."""
    saved = {**RECORDED_BEFORE, **read_run_args(folder)}
    mine = snapshot(run, with_data=False)
    # A checkpoint from before the key: an SFT file was split by the tail rule, other data by
    # none (the key's comment).
    saved.setdefault(SFT_SPLIT_RULE_KEY, None if mine[SFT_SPLIT_RULE_KEY] is None
                     else SFT_SPLIT_TAIL)
    note = None
    for key in _compared_keys(saved, mine, parts):
        if _normalise(saved.get(key)) == _normalise(mine[key]):
            continue
        if key == INDEXED_SAMPLES_KEY and None not in (saved.get(key), mine[key]) \
                and run.checkpoint.override_data_fingerprint:
            note = f"--override-data-fingerprint: {_mismatch(key, saved, mine)}"
            continue
        raise CheckpointError(_mismatch(key, saved, mine))
    saved_layout = saved.get(OPTIMIZER_LAYOUT_KEY)
    if parts.optimizer and saved_layout is not None \
            and bool(saved_layout) != bool(mine[OPTIMIZER_LAYOUT_KEY]):
        raise CheckpointError(_optimizer_layout_mismatch(bool(saved_layout)))
    if parts.optimizer and (problem := _expert_parallel_mismatch(saved, mine)
                            or _sharded_optimizer_mismatch(saved, mine)
                            or _decoupled_lr_mismatch(saved, mine, run.optimizer)):
        raise CheckpointError(problem)
    if check_data and not parts.finetune and mine["data_entries"] is not None:
        return check_data_sources(saved, run) or note  # None: megatron.wrap's own batches
    return note


def _expert_parallel_mismatch(saved: dict, mine: dict) -> str | None:
    """Why the optimizer state cannot follow an EP 1 <-> > 1 change, or None: megatron-core
    keeps the experts' state in an optimizer of its own only with expert parallelism, whose
    checkpoint nests the two optimizers' states under their indices with ``chained_<i>.`` key
    prefixes (EP 1: one flat state), so neither loads the other's (docs/MOE.md, Checkpoints).
    The fully reshardable format does not help: its tensors match by parameter, but the
    common state (param groups) keeps the saved nesting, and megatron-core's
    ChainedOptimizer.load_state_dict (Megatron-LM main's too) needs one entry per optimizer.
    Between sizes > 1 the plain optimizer's state is resharded by global expert index; the
    weights reshard across any change (``--no-load-optim``)."""
    saved_ep, ep = saved.get(EXPERT_PARALLEL_KEY) or 1, mine[EXPERT_PARALLEL_KEY]
    if (saved_ep > 1) == (ep > 1):
        return None
    return (f"--load: the checkpoint was saved with --expert-model-parallel-size {saved_ep}, "
            f"this run has {ep}: megatron-core keeps a separate expert optimizer only with "
            f"expert parallelism, so the optimizer states do not convert between 1 and > 1 "
            f"(resume with {'> 1' if saved_ep > 1 else '1'}, or add --no-load-optim to load the "
            f"weights only)")


def _sharded_optimizer_mismatch(saved: dict, mine: dict) -> str | None:
    """Why --use-distributed-optimizer's state cannot follow a model-parallel size change, or
    None (:data:`SHARDED_OPTIMIZER_SIZES`). A checkpoint saved in megatron-core's
    ``fully_reshardable`` format (``--dist-ckpt-optim-fully-reshardable``) follows every one of
    them; the ``dp_reshardable`` one (the default, and every checkpoint saved before the format
    was recorded) only data parallelism: unchecked, megatron-core stops every rank with a
    KeyError for the state of data-parallel groups the checkpoint does not have, or, for a
    virtual pipeline or expert tensor parallel change, a global-shape CheckpointingException.
    Checkpoints saved before a size was recorded are not checked for it (their run_args.json
    lacks the key; RECORDED_BEFORE has no value for it, since an old run's ETP is unknown)."""
    if not mine[OPTIMIZER_LAYOUT_KEY] \
            or saved.get(SHARDING_TYPE_KEY, DP_RESHARDABLE) == FULLY_RESHARDABLE:
        return None
    for key, flag in SHARDED_OPTIMIZER_SIZES.items():
        if key in saved and saved[key] != mine[key]:
            return (f"--load: the checkpoint's distributed optimizer state was saved "
                    f"{_with_flag(flag, saved[key])}, this run has {_value(mine[key])}: its "
                    f"format (megatron-core's {DP_RESHARDABLE}) reshards over data-parallel "
                    f"ranks only (resume {_with_flag(flag, saved[key])}, or add --no-load-optim "
                    f"to load the weights only; a save with "
                    f"--dist-ckpt-optim-fully-reshardable is resumable at another layout)")
    return None


def _decoupled_lr_mismatch(saved: dict, mine: dict, optimizer) -> str | None:
    """Why the optimizer state cannot follow a --decoupled-lr change, or None: on or off
    changes its param groups; another value is a schedule change, which needs the flag saying
    which side wins, as --lr's does (resume_consistency.check_scheduler)."""
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


def _optimizer_layout_mismatch(saved_distributed: bool) -> str:
    def setting(distributed: bool) -> str:
        return ("with --use-distributed-optimizer (state sharded over data-parallel ranks)"
                if distributed else "without --use-distributed-optimizer (state per parameter)")
    return (f"--load: the checkpoint's optimizer state was saved {setting(saved_distributed)}, "
            f"this run is {setting(not saved_distributed)}: the two layouts are not converted; "
            f"{'add' if saved_distributed else 'remove'} --use-distributed-optimizer to resume")


def _describe_source(spelled: str, source: dict) -> str:
    if HASH_ALGORITHM not in source:
        return repr(spelled)
    files = f"{len(source['files'])} files, " if source.get("files") else ""
    return (f"{spelled!r} ({source['path']}: {files}{source.get('size')} bytes, "
            f"{HASH_ALGORITHM} {str(source[HASH_ALGORITHM])[:_SHORT_HASH]}...)")


def _same_source(saved: dict, mine: dict) -> bool:
    """Files: the same content wherever it lies; other entries: the same spelling."""
    if HASH_ALGORITHM in saved and HASH_ALGORITHM in mine:
        return (saved.get("size"), saved[HASH_ALGORITHM]) == (mine["size"],
                                                               mine[HASH_ALGORITHM])
    if saved.get("path") == mine.get("path"):
        return True
    # A folder recorded before folders were fingerprinted: its spelling, against the content
    # fingerprint's resolved path.
    return HASH_ALGORITHM not in saved and isinstance(saved.get("path"), str) \
        and os.path.realpath(saved["path"]) == mine.get("path")


def check_data_sources(saved: dict, run: RunConfig) -> str | None:
    """Refuses ``--data-path`` files whose content differs from the checkpoint's, unless
    ``--override-data-fingerprint`` (then returns a note saying what was accepted)."""
    data_path = data_entries(run)
    spelled_saved = saved.get("data_entries") or saved.get("data_path") or []
    saved_sources = saved.get(DATA_SOURCES_KEY)
    if saved_sources is None:  # saved before fingerprints: compare the resolved paths
        saved_sources = [{"path": os.path.realpath(entry)} for entry in spelled_saved]
        mine = [{"path": os.path.realpath(entry)} for entry in data_path]
    else:
        mine = [data_fingerprint(entry) for entry in data_path]
    if len(saved_sources) == len(mine) and all(map(_same_source, saved_sources, mine)):
        return None
    index = next((i for i, (a, b) in enumerate(zip(saved_sources, mine)) if not _same_source(a, b)),
                 min(len(saved_sources), len(mine)))
    theirs = (_describe_source(spelled_saved[index] if index < len(spelled_saved) else "?",
                               saved_sources[index]) if index < len(saved_sources) else "nothing")
    ours = (_describe_source(data_path[index], mine[index]) if index < len(mine)
            else "nothing")
    difference = f"--data-path entry {index + 1} is {ours}, the checkpoint was trained on {theirs}"
    shard = changed_file(saved_sources[index], mine[index]) \
        if index < min(len(saved_sources), len(mine)) else None
    if shard is not None:
        difference += f" (in the folder, {shard})"
    if run.checkpoint.override_data_fingerprint:
        return f"--override-data-fingerprint: resuming on other data ({difference})"
    raise CheckpointError(
        f"--load: {difference}: other data would change the samples the resumed run reads; "
        f"restore the checkpoint's data, or pass --override-data-fingerprint to train on this "
        f"data deliberately")


def _mismatch(key: str, saved: dict, mine: dict) -> str:
    if key == "padded_vocab_size":
        def why(side):
            return (f"{side['padded_vocab_size']} (vocab {side['vocab_size']} padded to "
                    f"--make-vocab-size-divisible-by {side['make_vocab_size_divisible_by']} x TP "
                    f"{side['tensor_model_parallel_size']})")
        return (f"--load: the checkpoint's padded vocabulary is {why(saved)}, this run's is "
                f"{why(mine)}: that would change the model; choose "
                f"--make-vocab-size-divisible-by so that both give the same size")
    if key == "max_position_embeddings" and _follows_seq_length(saved) \
            and _follows_seq_length(mine):
        # Neither run set --max-position-embeddings (or both set it to --seq-length): the user
        # changed --seq-length, so that is the flag to name (test_resume_consistency.py).
        return (f"--load: the checkpoint was trained with --seq-length {saved['seq_length']}, "
                f"this run has {mine['seq_length']}: that would change the model (its position "
                f"table has --seq-length entries); use the checkpoint's value")
    if key == INDEXED_SAMPLES_KEY:
        return _indexed_samples_mismatch(saved.get(key), mine[key])
    if key == SFT_SPLIT_RULE_KEY and saved.get(key) == SFT_SPLIT_TAIL:
        return (f"--load: the checkpoint's SFT run held out the last 5% of its file for "
                f"validation and trained on the rest (before --sft honoured --split, its "
                f"--split {saved.get('split')} was not applied), this run splits the file by "
                f"--split {mine['split']}: another training set; resume without --split to "
                f"keep the checkpoint's samples")
    what = "the model" if key in MODEL_KEYS else "the fields read from the SFT records" \
        if key in SFT_KEYS else "the data order"
    return (f"--load: the checkpoint was trained with {_flag(key)} {saved.get(key)}, this run "
            f"has {mine[key]}: that would change {what}; use the checkpoint's value")


def _indexed_samples_mismatch(saved: int | None, mine: int | None) -> str:
    if saved is None or mine is None:
        what = "mock or SFT data" if saved is None else "indexed data"
        return (f"--load: the checkpoint was trained on {what}, this run reads "
                f"{'indexed data' if saved is None else 'mock or SFT data'}: another sample "
                f"stream; use the checkpoint's data flags")
    return (f"--load: the checkpoint's indexed data was built for {saved} training samples "
            f"(--train-iters x --global-batch-size), this run's for {mine}: megatron-core "
            f"shuffles over as many epochs as that needs, so the resumed run would read "
            f"another sample order; keep the checkpoint's --train-iters (or pass "
            f"--override-data-fingerprint to resume on that other order deliberately)")


def _follows_seq_length(side: dict) -> bool:
    """Whether the position table of this side is --seq-length long (the default)."""
    return side.get("seq_length") is not None and \
        side.get("max_position_embeddings") == side["seq_length"]


def check_scheduler(state: dict, scheduler, run: RunConfig) -> None:
    """Refuses a schedule difference unless a flag says which side wins (module docstring)."""
    optimizer = run.optimizer
    if optimizer.override_opt_param_scheduler or optimizer.use_checkpoint_opt_param_scheduler:
        return
    samples_per_iter = run.training.global_batch_size
    sample_based = optimizer.lr_decay_iters is None  # --train-samples (schedule_arguments.py)
    for key, (flag, attribute, in_samples) in SCHEDULER_KEYS.items():
        saved, mine = state.get(key), getattr(scheduler, attribute)
        if saved is None or saved == mine:
            continue
        if key in RAMP_ONLY_KEYS and scheduler.wd_incr_style == "constant":
            continue  # e.g. a longer --train-iters: a constant weight decay stays the same
        if in_samples and sample_based:
            flag, saved, mine = SAMPLE_BASED_FLAGS[key], f"{saved:g}", f"{mine:g}"
        elif in_samples:  # megatron-core counts in samples; users set iterations
            saved, mine = f"{saved / samples_per_iter:g}", f"{mine / samples_per_iter:g}"
        raise CheckpointError(
            f"--load: the checkpoint's schedule has {flag} {saved}, this run has {mine}; pass "
            f"--override-opt_param-scheduler to use this run's value or "
            f"--use-checkpoint-opt_param-scheduler to keep the checkpoint's")
