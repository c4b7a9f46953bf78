"""``pretrain(args)``: tokenizer, datasets, model, loop -- what pretrain_gpt.py runs."""

from __future__ import annotations

from megatron.training.data import UnpackedBatchProvider
from megatron.training.datasets.builder import build_datasets
from megatron.training.tokenizer import build_tokenizer
from megatron.training.training import setup_model_and_optimizer, train


def _set_sample_counts(args) -> None:
    """How many samples the datasets must provide (train, and eval at every eval point)."""
    args.train_samples = args.train_iters * args.global_batch_size
    num_evals = args.train_iters // max(args.eval_interval, 1) + 1
    args.eval_samples = num_evals * max(args.eval_iters, 0) * args.global_batch_size


def build_data_providers(args):
    """Tokenizer-aware datasets wrapped in the step-batch provider the loop consumes."""
    tokenizer = build_tokenizer(args.tokenizer_type, args.vocab_size, args.tokenizer_model)
    if args.vocab_size is None:
        args.vocab_size = tokenizer.vocab_size
    _set_sample_counts(args)
    train_ds, valid_ds = build_datasets(args, tokenizer)
    valid = UnpackedBatchProvider(valid_ds, args) if valid_ds is not None else None
    return UnpackedBatchProvider(train_ds, args), valid


def pretrain(args) -> list[dict]:
    """Trains a GPT as the flags say; returns {"lm_loss", "grad_norm"} per iteration."""
    train_provider, valid_provider = build_data_providers(args)
    state = setup_model_and_optimizer(args)
    return train(args, state, train_provider, valid_provider)
