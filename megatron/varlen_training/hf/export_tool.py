"""Megatron checkpoint (``--save`` directory) -> Hugging Face checkpoint directory.

    python tools/export_hf.py --load CKPT_ROOT --save-hf OUT_DIR --hf-checkpoint ORIGINAL_HF_DIR
    python tools/export_hf.py --load CKPT_ROOT --save-hf OUT_DIR <the model flags of the run>
    python tools/export_hf.py --load CKPT_ROOT --save-hf OUT_DIR --use-checkpoint-args

Takes pretrain_gpt.py's flags (the architecture from ``--hf-checkpoint``, from the model
flags, or with ``--use-checkpoint-args`` from the checkpoint's ``run_args.json``; training-only
flags may be left out; ``--ckpt-step N`` exports iteration N instead of the latest). Runs as one
process, or under torchrun in any TP/PP layout: dist_checkpointing reshards the weights on load.
Only the model weights are read.
"""

from __future__ import annotations

import sys

import torch

from megatron.core import dist_checkpointing
from megatron.varlen_training import checkpoint_model_flags
from megatron.varlen_training.arguments import ERROR_EXIT_CODE
from megatron.varlen_training.config.from_flags import parse_run_config_or_exit
from megatron.varlen_training.checkpoint import (
    check_checkpoint, model_keys, model_sharded_state_dict,
)
from megatron.varlen_training.config import RunConfig
from megatron.varlen_training.errors import (
    agree_on_errors, exit_on_user_errors, print_error_line,
)
from megatron.varlen_training.hf.exporter import save_hf
from megatron.varlen_training.initialize import initialize_megatron, shutdown
from megatron.varlen_training.log import print_rank_0
from megatron.varlen_training.model import build_model, build_transformer_config, unwrap
from megatron.varlen_training.tokenizer import build_run_tokenizer

EXPORT_PROG = "export_hf.py"  # what usage lines and errors call this tool

# Flags the parser requires that an export does not use; the caller's own values win.
_UNUSED_REQUIRED_FLAGS = ["--train-iters", "1", "--lr", "0", "--mock-data"]
# Required too, unless --use-checkpoint-args takes it from the checkpoint (where a value given
# here would count as the command line's and win over the checkpoint's).
_UNUSED_SEQ_LENGTH = ["--seq-length", "2"]


def _unused_required_flags(argv: list[str]) -> list[str]:
    taken = checkpoint_model_flags.load_flags(argv).use_checkpoint_args
    return _UNUSED_REQUIRED_FLAGS + ([] if taken else _UNUSED_SEQ_LENGTH)


def load_model_weights(root: str, model: list[torch.nn.Module], step: int | None = None) -> int:
    """Loads only the model weights of the newest checkpoint under ``root`` (``step``:
    ``--ckpt-step``'s iteration); its iteration."""
    # Verified (manifest) and vetted (restricted unpickling) exactly as --load does.
    iteration, folder = check_checkpoint(root, step)
    keys = model_keys(model)
    template = {key: model_sharded_state_dict(chunk) for key, chunk in zip(keys, model)}
    state = dist_checkpointing.load(template, folder)
    for key, chunk in zip(keys, model):
        unwrap(chunk).load_state_dict(state[key])
    return iteration


def with_tokenizer_vocabulary(run: RunConfig) -> RunConfig:
    """The run with its vocabulary resolved as training resolved it (the Trainer's start):
    without ``--vocab-size`` (and ``--hf-checkpoint``) the tokenizer's size decides it."""
    data = run.data
    tokenizer = agree_on_errors(build_run_tokenizer, data, run.model.vocab_size)
    return run.with_vocabulary(tokenizer.vocab_size)


def main(argv: list[str] | None = None) -> str:
    argv = list(sys.argv[1:] if argv is None else argv)
    run = parse_run_config_or_exit(_unused_required_flags(argv) + argv, prog=EXPORT_PROG)
    checkpoint = run.checkpoint
    if not checkpoint.load or not checkpoint.save_hf:
        print_error_line("export_hf.py", "needs --load CKPT_ROOT and --save-hf OUT_DIR")
        sys.exit(ERROR_EXIT_CODE)
    initialize_megatron(run)
    try:
        with exit_on_user_errors("export_hf.py"):  # a bad or unsafe checkpoint: one line
            run = with_tokenizer_vocabulary(run)
            model = build_model(run, build_transformer_config(run))
            iteration = load_model_weights(checkpoint.load, model, checkpoint.ckpt_step)
            print_rank_0(f"> loaded iteration {iteration} from {checkpoint.load}")
            return save_hf(run, model)
    finally:
        shutdown()
