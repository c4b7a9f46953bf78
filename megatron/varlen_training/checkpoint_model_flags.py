"""``--use-checkpoint-args``: the model flags of the checkpoint being loaded, Megatron-LM's way.

The checkpoint is the one the run loads (:func:`load_options.checkpoint_source`'s choice):
``--load`` when it holds one, else ``--pretrained-checkpoint``; at ``--ckpt-step`` when given,
else the iteration its tracker file names. Its ``run_args.json`` (resume/run_args_record.py) records
the model flags; before the command line is parsed they become the parser's defaults (so
``--num-layers``, ``--hidden-size``, ``--num-attention-heads`` and ``--seq-length`` are no
longer required), each logged as Megatron-LM's ``Setting <name> to <value> from checkpoint``.

Which side wins when the command line gives a flag too follows Megatron-LM's
``load_args_from_checkpoint``:

- the sizes (:data:`COMMAND_LINE_WINS`: layers, hidden and FFN size, heads, sequence length,
  position table, head dimension, the vocabulary padding) and ``--moe-token-dispatcher-type``
  (Megatron-LM's ``_set_arg`` without ``force``; recorded only where the run chose another
  than the default, which otherwise follows this run's packing): the command line's value (a
  model size that differs from the checkpoint's is then refused at load, naming the flag);
- the rest (:data:`CHECKPOINT_WINS`: query groups, position encoding, RoPE base and share, norm,
  SwiGLU, squared ReLU, biases, tied embeddings, MTP, MoE and Mamba shape, the MoE router's
  pre-softmax, score function, expert bias and top-k scaling, the dropouts, query-key layer
  scaling, ``--spec``, ``--tiktoken-pattern`` and ``--tiktoken-num-special-tokens`` (not in
  Megatron-LM's list; taken like the pattern: both decide a TikTokenizer's ids)): the
  checkpoint's value replaces the command line's, with a line naming the flag it overrides;
- the tokenizer (:data:`TOKENIZER_KEYS`: ``--tokenizer-type`` and ``--tokenizer-model``): the
  checkpoint's, as the rest, unless ``--no-use-tokenizer-model-from-checkpoint-args`` (Megatron-LM's
  flag; the tokenizer file may lie elsewhere on this cluster) keeps the command line's. A
  TikTokenizer's ``--vocab-size`` (it sizes that tokenizer) is a default like the sizes; other
  file tokenizers know their vocabulary again.

Not taken, as in Megatron-LM: precision (``--bf16``/``--fp16``), the parallel layout and training
settings. Megatron-LM also takes a few flags this fork does not build (MoE kernels, latent MoE,
heterogeneous layers) or derives (``--add-position-embedding``, ``--is-hybrid-model`` from the
entry point, the padded vocabulary from its flags). Keys a checkpoint does not record (saved before
they were) are left to the command line (``Checkpoint did not provide arguments <name>``); a
required flag that neither gives is one line naming it.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from megatron.varlen_training.flag_errors import ArgumentValidationError, require
from megatron.varlen_training.load_options import (
    TrackerError, holds_checkpoint, iteration_folder, read_latest_iteration,
)
from megatron.varlen_training.log import print_rank_0

FLAG = "--use-checkpoint-args"
# Megatron-LM's ``_set_arg(name)`` without ``force``: the checkpoint's value is a default only.
COMMAND_LINE_WINS = ("num_layers", "hidden_size", "ffn_hidden_size", "seq_length",
                     "num_attention_heads", "kv_channels", "max_position_embeddings",
                     "make_vocab_size_divisible_by", "vocab_size", "moe_token_dispatcher_type",
                     # Not in Megatron-LM's list (it has no such flags): taken as defaults too.
                     "norm_epsilon", "qk_layernorm", "use_rope_scaling", "rope_scaling_factor")
# Megatron-LM's ``_set_arg(name, force=True)``: the checkpoint's value replaces the command line's.
CHECKPOINT_WINS = ("group_query_attention", "num_query_groups", "position_embedding_type",
                   "rotary_base", "rotary_percent", "disable_bias_linear", "add_qkv_bias", "swiglu",
                   "squared_relu", "untie_embeddings_and_output_weights", "normalization",
                   "mtp_num_layers",
                   # Megatron-LM's apply_layernorm_1p, under its 0.16.1 dest (the config field)
                   "layernorm_zero_centered_gamma",
                   "num_experts", "moe_ffn_hidden_size", "moe_router_topk", "moe_layer_freq",
                   "moe_shared_expert_intermediate_size",
                   "hybrid_override_pattern", "hybrid_attention_ratio", "hybrid_mlp_ratio",
                   "mamba_state_dim", "mamba_head_dim", "mamba_num_groups", "mamba_num_heads",
                   "moe_router_pre_softmax", "moe_router_score_function",
                   "moe_router_enable_expert_bias", "moe_router_topk_scaling_factor",
                   "hidden_dropout", "attention_dropout", "apply_query_key_layer_scaling",
                   "spec", "tiktoken_pattern", "tiktoken_num_special_tokens")
# Megatron-LM's forced tokenizer flags, taken only with use_tokenizer_model_from_checkpoint_args.
TOKENIZER_KEYS = ("tokenizer_type", "tokenizer_model")
NO_TOKENIZER_FLAGS = ("--no-use-tokenizer-model-from-checkpoint-args",
                      "--disable-use-tokenizer-model-from-checkpoint-args")
# Required on the command line unless the checkpoint supplies them (arguments.py).
REQUIRED_MODEL_FLAGS = ("num_layers", "hidden_size", "num_attention_heads", "seq_length")
# The tokenizers --vocab-size sizes (the others read their vocabulary from their files).
SIZED_TOKENIZERS = ("NullTokenizer", "TikTokenizer")


@dataclass(frozen=True)
class LoadFlags:
    """The flags that say which checkpoint a run loads, read before the command line is parsed."""

    use_checkpoint_args: bool = False
    load: str | None = None
    pretrained_checkpoint: str | None = None
    ckpt_step: int | None = None
    save: str | None = None
    use_tokenizer_model_from_checkpoint_args: bool = True


@dataclass(frozen=True)
class CheckpointFlags:
    """The flag values taken from a checkpoint (argparse dest -> value) and where from."""

    record: str
    """The checkpoint's ``run_args.json``."""
    values: dict
    missing: tuple[str, ...]
    """Required flags the checkpoint does not record: the command line must give them."""


def load_flags(argv: list[str]) -> LoadFlags:
    """The load flags of a command line, before it is parsed (bad values: the parser's error)."""
    peek = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    peek.add_argument(FLAG, action="store_true")
    for name in ("--load", "--pretrained-checkpoint", "--save"):
        peek.add_argument(name, default=None)
    peek.add_argument("--ckpt-step", default=None)
    peek.add_argument(*NO_TOKENIZER_FLAGS, action="store_false",
                      dest="use_tokenizer_model_from_checkpoint_args")
    try:
        known, _ = peek.parse_known_args(argv)
        step = None if known.ckpt_step is None else int(known.ckpt_step)
    except (SystemExit, ValueError):  # the full parser names the bad value in one line
        return LoadFlags()
    return LoadFlags(known.use_checkpoint_args, known.load, known.pretrained_checkpoint, step,
                     known.save, known.use_tokenizer_model_from_checkpoint_args)


def load_flags_of(values: dict) -> LoadFlags:
    """The load flags of a facade config's values (argparse dest -> value)."""
    return LoadFlags(bool(values.get("use_checkpoint_args")), values.get("load"),
                     values.get("pretrained_checkpoint"), values.get("ckpt_step"),
                     values.get("save"),
                     values.get("use_tokenizer_model_from_checkpoint_args", True))


def _iteration(root: str, step: int | None) -> int:
    if step is not None:
        return step
    try:
        return read_latest_iteration(root)
    except TrackerError as err:
        raise ArgumentValidationError(f"{FLAG}: {err}; pass --ckpt-step N to choose the "
                                      f"iteration to read") from None


def _checkpoint_folder(flags: LoadFlags) -> str | None:
    """The iteration folder the run will load (``--load`` first, as load_options decides)."""
    for root in (flags.load, flags.pretrained_checkpoint):
        if holds_checkpoint(root, flags.ckpt_step):
            return iteration_folder(root, _iteration(root, flags.ckpt_step))
    return None


def _restartable_first_launch(flags: LoadFlags) -> bool:
    """``--save`` and ``--load`` the same folder, nothing saved yet (load_options)."""
    return flags.load is not None and flags.save is not None and flags.ckpt_step is None \
        and flags.pretrained_checkpoint is None \
        and os.path.realpath(flags.load) == os.path.realpath(flags.save)


def _no_checkpoint_message(flags: LoadFlags) -> str:
    step = f" iteration {flags.ckpt_step}" if flags.ckpt_step is not None else ""
    where = " nor ".join(f"{name} {root!r}" for name, root in (
        ("--load", flags.load), ("--pretrained-checkpoint", flags.pretrained_checkpoint))
        if root is not None)
    return (f"{FLAG}: {where} holds no checkpoint{step} to take the model flags from; point "
            f"--load at a checkpoint, or drop {FLAG} and pass the model flags")


def flag_values(saved: dict, with_tokenizer: bool = True) -> dict:
    """``run_args.json``'s model keys as the flag values that build that model (dest -> value);
    keys it does not record are left out, recorded Nones stay None. ``with_tokenizer``: the
    tokenizer's too (:data:`TOKENIZER_KEYS`)."""
    keys = COMMAND_LINE_WINS + CHECKPOINT_WINS + (TOKENIZER_KEYS if with_tokenizer else ())
    values = {key: saved[key] for key in keys if key in saved}
    if "num_query_groups" in saved and "num_attention_heads" in saved:
        # Recorded resolved: as many groups as heads is plain multi-head attention.
        grouped = saved["num_query_groups"] != saved["num_attention_heads"]
        values["group_query_attention"] = grouped
        if not grouped:  # --num-query-groups does nothing without --group-query-attention
            values.pop("num_query_groups")
    if saved.get("tokenizer_type", SIZED_TOKENIZERS[0]) not in SIZED_TOKENIZERS:
        values.pop("vocab_size", None)  # recorded from the tokenizer, which knows it again
    if isinstance(values.get("moe_layer_freq"), list):
        values["moe_layer_freq"] = list(values["moe_layer_freq"])
    return values


def read_checkpoint_flags(flags: LoadFlags | list[str]) -> CheckpointFlags | None:
    """The model flags of the checkpoint ``flags`` (or a command line) load; None without
    ``--use-checkpoint-args`` or at a restartable job's first launch (nothing saved yet: the
    command line's flags).

    Raises:
        ArgumentValidationError: nothing to load, or an unreadable ``run_args.json`` (one line).
    """
    if isinstance(flags, list):
        flags = load_flags(flags)
    if not flags.use_checkpoint_args:
        return None
    require(flags.load is not None or flags.pretrained_checkpoint is not None,
            f"{FLAG} takes the model flags from the checkpoint being loaded, but there is "
            f"nothing to load (pass --load or --pretrained-checkpoint)")
    folder = _checkpoint_folder(flags)
    if folder is None:
        require(_restartable_first_launch(flags), _no_checkpoint_message(flags))
        print_rank_0("Checkpoint not found to provide arguments, using provided arguments.")
        return None
    # Imported here: run_args_record imports the run configs, which import this layer.
    from megatron.varlen_training.errors import CheckpointError
    from megatron.varlen_training.resume.run_args_record import RUN_ARGS_FILENAME, read_run_args

    record = os.path.join(folder, RUN_ARGS_FILENAME)
    require(os.path.isfile(record),
            f"{FLAG}: checkpoint {folder!r} has no {RUN_ARGS_FILENAME} to take the model flags "
            f"from (not saved by this fork?); drop {FLAG} and pass the model flags")
    try:  # a garbled record: read_run_args' one line
        saved = read_run_args(folder)
    except CheckpointError as err:
        raise ArgumentValidationError(f"{FLAG}: {err}") from None
    missing = tuple(key for key in REQUIRED_MODEL_FLAGS if saved.get(key) is None)
    with_tokenizer = flags.use_tokenizer_model_from_checkpoint_args
    return CheckpointFlags(record, flag_values(saved, with_tokenizer), missing)


def apply_as_defaults(parser, taken: CheckpointFlags | None) -> None:
    """The checkpoint's values become ``parser``'s defaults; the flags they supply, and the
    required ones it lacks (checked in :func:`override_command_line`), become optional.
    ``parser``: a MegatronArgumentParser (its ``flag_actions``)."""
    if taken is None:
        return
    known = {action.dest for action in parser.flag_actions}
    # A recorded None (a dense run's MoE keys) leaves the parser's own default, as Megatron-LM
    # leaves a flag the checkpoint does not provide.
    defaults = {dest: value for dest, value in taken.values.items()
                if dest in known and value is not None}
    for action in parser.flag_actions:
        if action.dest in defaults or action.dest in taken.missing:
            action.required = False
    parser.set_defaults(**defaults)


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def override_command_line(args: argparse.Namespace, taken: CheckpointFlags | None) -> None:
    """After parsing: the checkpoint's value of each :data:`CHECKPOINT_WINS` flag replaces a
    different one given on the command line, and every value taken is logged (Megatron-LM's
    lines). A required flag neither side gives is one line naming it."""
    if taken is None:
        return
    absent = [key for key in taken.missing if getattr(args, key, None) is None]
    require(not absent,
            f"{FLAG}: {taken.record} does not record "
            f"{', '.join(absent)} (saved before it did): pass "
            f"{', '.join(_flag(key) for key in absent)} on the command line")
    for dest, value in taken.values.items():
        if not hasattr(args, dest):
            continue  # a flag of another entry point (the hybrid ones outside pretrain_mamba.py)
        if value is None:
            print_rank_0(f"Checkpoint did not provide arguments {dest}")
            continue
        given = getattr(args, dest)
        if given == value:
            print_rank_0(f"Setting {dest} to {value} from checkpoint")
        elif dest in CHECKPOINT_WINS + TOKENIZER_KEYS:
            setattr(args, dest, value)
            print_rank_0(f"Setting {dest} to {value} from checkpoint (overrides {_flag(dest)} "
                         f"{given} on the command line)")
        else:
            print_rank_0(f"Keeping {_flag(dest)} {given} from the command line (the "
                         f"checkpoint has {value})")
