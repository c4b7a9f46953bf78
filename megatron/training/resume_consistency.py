"""A resumed run continues the run it resumes, or says in one line why it cannot.

Every checkpoint holds ``run_args.json``: the settings that shape the model, the data order and
the LR/WD schedule. On ``--load``:

- model shape (layers, sizes, heads, vocabulary and tokenizer, padded vocabulary, ...) must match: a change
  would load weights into a different model. The parallel layout may change (dist_checkpointing
  reshards), except where it changes the model: the padded vocabulary depends on
  ``--make-vocab-size-divisible-by`` x TP.
- data order (``--seed``, ``--global-batch-size``, ``--data-path``, the mock length config) must
  match: the resumed run would otherwise read other samples than the run it continues.
- the LR/WD schedule follows Megatron-LM: a difference between this run's flags and the
  checkpoint's scheduler is refused unless ``--override-opt_param-scheduler`` (this run's
  flags win; the number of samples already consumed is kept) or
  ``--use-checkpoint-opt_param-scheduler`` (the checkpoint's schedule wins) says which side wins.

Every refusal is a one-line :class:`CheckpointError` naming the flag and both values.
"""

from __future__ import annotations

import json
import os

from megatron.training.checkpoint_integrity import atomic_write_text
from megatron.training.errors import CheckpointError

RUN_ARGS_FILENAME = "run_args.json"
MODEL_KEYS = (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
    "max_position_embeddings", "position_embedding_type", "rotary_base", "normalization",
    "swiglu", "disable_bias_linear", "untie_embeddings_and_output_weights", "mtp_num_layers",
    "padded_vocab_size", "vocab_size", "tokenizer_type", "bf16", "fp16",
    # Hugging Face families (--hf-checkpoint) and hybrid models (pretrain_mamba.py): absent
    # flags read as None on both sides, so a GPT checkpoint never matches a hybrid run.
    "kv_channels", "norm_epsilon", "add_qkv_bias", "qk_layernorm", "use_rope_scaling",
    "rope_scaling_factor", "hybrid_override_pattern", "hybrid_attention_ratio",
    "hybrid_mlp_ratio", "mamba_state_dim", "mamba_head_dim", "mamba_num_groups", "mamba_num_heads",
)
DATA_ORDER_KEYS = ("seed", "global_batch_size", "data_path", "sft_mock_dataset_config_json")
# Context shown next to a padded-vocabulary mismatch (it is derived, not a flag).
_VOCAB_CONTEXT = ("make_vocab_size_divisible_by", "tensor_model_parallel_size")
# megatron-core scheduler state key -> (this run's flag, scheduler attribute, samples per unit)
SCHEDULER_KEYS = {
    "max_lr": ("--lr", "max_lr", False),
    "min_lr": ("--min-lr", "min_lr", False),
    "lr_warmup_steps": ("--lr-warmup-iters", "lr_warmup_steps", True),
    "lr_decay_steps": ("--lr-decay-iters (default --train-iters)", "lr_decay_steps", True),
    "lr_decay_style": ("--lr-decay-style", "lr_decay_style", False),
    "start_wd": ("--weight-decay", "start_wd", False),
    "end_wd": ("--weight-decay", "end_wd", False),
}


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def snapshot(args) -> dict:
    keys = MODEL_KEYS + DATA_ORDER_KEYS + _VOCAB_CONTEXT
    return {key: getattr(args, key, None) for key in keys}


def save_run_args(folder: str, args) -> str:
    atomic_write_text(os.path.join(folder, RUN_ARGS_FILENAME),
                      json.dumps(snapshot(args), indent=1, sort_keys=True) + "\n")
    return RUN_ARGS_FILENAME


def _normalise(value):
    return list(value) if isinstance(value, tuple) else value


def check_run_args(folder: str, args) -> None:
    """Refuses a model-shape or data-order change (module docstring)."""
    path = os.path.join(folder, RUN_ARGS_FILENAME)
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint {folder!r} has no {RUN_ARGS_FILENAME}: cannot check "
                              f"that this run continues it")
    with open(path, encoding="utf-8") as handle:
        saved = json.load(handle)
    mine = snapshot(args)
    for key in MODEL_KEYS + DATA_ORDER_KEYS:
        if key == "data_path" and mine[key] is None:
            continue  # the caller brings its own batches (megatron.wrap)
        if _normalise(saved.get(key)) != _normalise(mine[key]):
            raise CheckpointError(_mismatch(key, saved, mine))


def _mismatch(key: str, saved: dict, mine: dict) -> str:
    if key == "padded_vocab_size":
        def why(side):
            return (f"{side['padded_vocab_size']} (vocab {side['vocab_size']} padded to "
                    f"--make-vocab-size-divisible-by {side['make_vocab_size_divisible_by']} x TP "
                    f"{side['tensor_model_parallel_size']})")
        return (f"--load: the checkpoint's padded vocabulary is {why(saved)}, this run's is "
                f"{why(mine)}: that would change the model; choose "
                f"--make-vocab-size-divisible-by so that both give the same size")
    what = "the model" if key in MODEL_KEYS else "the data order"
    return (f"--load: the checkpoint was trained with {_flag(key)} {saved.get(key)}, this run "
            f"has {mine[key]}: that would change {what}; use the checkpoint's value")


def check_scheduler(state: dict, scheduler, args) -> None:
    """Refuses a schedule difference unless a flag says which side wins (module docstring)."""
    if args.override_opt_param_scheduler or args.use_checkpoint_opt_param_scheduler:
        return
    samples_per_iter = args.global_batch_size
    for key, (flag, attribute, in_samples) in SCHEDULER_KEYS.items():
        saved, mine = state.get(key), getattr(scheduler, attribute)
        if saved is None or saved == mine:
            continue
        if in_samples:  # megatron-core counts in samples; users set iterations
            saved, mine = f"{saved / samples_per_iter:g}", f"{mine / samples_per_iter:g}"
        raise CheckpointError(
            f"--load: the checkpoint's schedule has {flag} {saved}, this run has {mine}; pass "
            f"--override-opt_param-scheduler to use this run's value or "
            f"--use-checkpoint-opt_param-scheduler to keep the checkpoint's")
