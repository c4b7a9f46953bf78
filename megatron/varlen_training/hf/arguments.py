"""Flags for Hugging Face checkpoints and the Llama/Qwen model features they need.

``--hf-checkpoint DIR`` is resolved while the command line is parsed, before anything reads the
arguments: the checkpoint's ``config.json`` supplies the defaults of the architecture flags
(:func:`megatron.varlen_training.hf.config.flag_values`), so those flags become optional, and a flag
given with a different value than the checkpoint's is a one-line error naming both values.
Nothing is written into ``args`` afterwards.
"""

from __future__ import annotations

import argparse

from megatron.varlen_training.hf.config import (
    HFConfigError, MTP_EXPORT_HINT, flag_values, load_hf_config, overridable_defaults,
)
from megatron.varlen_training.model_file_tokenizers import TIKTOKEN_TYPE

HF_CHECKPOINT_FLAG = "--hf-checkpoint"


def add_hf_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Hugging Face checkpoints and Llama/Qwen model features")
    group.add_argument(HF_CHECKPOINT_FLAG, default=None, metavar="DIR",
                       help="Initialise from this local Hugging Face checkpoint (Llama, Mistral, "
                            "Qwen2, Qwen3, Qwen3-MoE, DeepSeek-V3); its config.json supplies "
                            "the architecture flags.")
    group.add_argument("--save-hf", default=None, metavar="DIR",
                       help="Write the trained model as a Hugging Face checkpoint at the end.")
    group.add_argument("--kv-channels", type=int, default=None,
                       help="Attention head dimension. Default: hidden size / attention heads.")
    group.add_argument("--norm-epsilon", type=float, default=1e-5,
                       help="Epsilon of the layer norms.")
    group.add_argument("--add-qkv-bias", action="store_true",
                       help="Bias on the query/key/value projection only (Qwen2).")
    group.add_argument("--qk-layernorm", action="store_true",
                       help="Normalise queries and keys per head before RoPE (Qwen3).")
    group.add_argument("--use-rope-scaling", action="store_true",
                       help="Llama-3 RoPE frequency scaling (with --rope-scaling-factor).")
    group.add_argument("--rope-scaling-factor", type=float, default=8.0,
                       help="Llama-3 RoPE scaling factor.")


def checkpoint_dir(argv: list[str]) -> str | None:
    """The ``--hf-checkpoint`` of a command line (None without), read before it is parsed."""
    peek = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    peek.add_argument(HF_CHECKPOINT_FLAG, default=None)
    known, _ = peek.parse_known_args(argv)
    return known.hf_checkpoint


def apply_checkpoint_defaults(parser, hf_dir: str | None) -> dict:
    """With an ``--hf-checkpoint`` directory: the checkpoint's architecture becomes the
    parser's defaults (required flags become optional). Returns the architecture flags ({}
    without). ``parser``: a MegatronArgumentParser (its ``flag_actions``).

    Raises:
        HFConfigError: No config.json, or an unsupported architecture or field (one line).
    """
    if hf_dir is None:
        return {}
    config = load_hf_config(hf_dir)
    fixed = flag_values(config)
    defaults = {**overridable_defaults(config), **fixed}
    for action in parser.flag_actions:
        if action.dest in defaults:
            action.required = False
    parser.set_defaults(**defaults)
    return fixed


def _flag(parser, dest: str) -> str:
    for action in parser.flag_actions:
        if action.dest == dest and action.option_strings:
            return action.option_strings[0]
    return dest


def check_conflicts(parser, args: argparse.Namespace, fixed: dict) -> None:
    """A flag that disagrees with the checkpoint's architecture is an error naming both."""
    for dest, value in fixed.items():
        given = getattr(args, dest)
        if given != value:
            raise HFConfigError(
                f"{_flag(parser, dest)} {given} conflicts with the {HF_CHECKPOINT_FLAG} "
                f"{args.hf_checkpoint} config.json value {value} (drop the flag or change it "
                f"to match)")


def validate_hf_args(args: argparse.Namespace, require) -> None:
    """Checks the Hugging Face flags after the others (``require(cond, message)``)."""
    require(args.kv_channels is None or args.kv_channels > 0,
            f"--kv-channels must be positive (got {args.kv_channels})")
    require(not (args.hf_checkpoint and args.mtp_num_layers),
            f"--hf-checkpoint does not support --mtp-num-layers {args.mtp_num_layers} (MTP "
            "layers are not imported: Llama/Qwen have none, DeepSeek-V3's are skipped as "
            "transformers skips them)")
    require(not (args.save_hf and args.mtp_num_layers), MTP_EXPORT_HINT.format(
        what="--save-hf", layers=args.mtp_num_layers))
    _validate_spec(args, require)
    require(not (args.hf_checkpoint and args.tokenizer_type == TIKTOKEN_TYPE),
            f"--hf-checkpoint with --tokenizer-type {TIKTOKEN_TYPE} is not supported: the "
            f"checkpoint's config.json vocab_size counts its embedding rows, while "
            f"{TIKTOKEN_TYPE} is sized by --vocab-size and numbers its tokens after its "
            f"--tiktoken-num-special-tokens special ids, so its ids would not index that "
            f"embedding; use --tokenizer-type HuggingFaceTokenizer --tokenizer-model "
            f"{args.hf_checkpoint}")
    if args.hf_checkpoint:
        # Imported here: the parser itself stays free of torch (wrap configs build without it).
        from megatron.varlen_training.hf.safetensors_io import (
            CheckpointFileError, SafetensorsReader,
        )

        try:  # the index names only existing shards (a missing one fails here, not mid-load)
            SafetensorsReader(args.hf_checkpoint)
        except (CheckpointFileError, ImportError) as err:
            require(False, f"--hf-checkpoint: {err}")
    # --save-hf's architecture is checked on the run's model config (config/from_flags.py).


def _validate_spec(args: argparse.Namespace, require) -> None:
    """A custom ``--spec`` decides the layer's modules: the Hugging Face weight mapping is
    written for our default spec, and ``--qk-layernorm`` only reaches a spec built with QK
    norms. Both would otherwise be silently wrong (weights under other meanings, no norm)."""
    # Imported here: the parser itself stays free of torch (wrap configs build without it).
    from megatron.varlen.model import check_has_qk_layernorm, is_default_spec, load_layer_spec

    if is_default_spec(args.spec):
        return
    shown = " ".join(args.spec)
    for flag, value in ((HF_CHECKPOINT_FLAG, args.hf_checkpoint), ("--save-hf", args.save_hf)):
        require(value is None,
                f"{flag} maps Hugging Face weights onto the default layer spec, not --spec "
                f"{shown} (drop --spec, or convert the weights yourself)")
    if args.qk_layernorm:
        try:
            check_has_qk_layernorm(load_layer_spec(args.spec, args.normalization), args.spec)
        except ValueError as err:
            require(False, str(err))
