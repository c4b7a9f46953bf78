"""The run description: the validated flags plus the values derived from them, read-only.

Values that several parts of a run read (the padded vocabulary for the model and the FLOPs
count, the sample counts for the datasets, the vocabulary size a tokenizer may supply) are
derived ONCE: during argument validation (:func:`derive_run_values`) where the flags suffice,
and by :func:`describe_run` where the tokenizer has to say the vocabulary size. Everything after
that reads the :class:`RunDescription`, which refuses writes, so no builder can leave a value in
``args`` for a later reader to depend on.
"""

from __future__ import annotations

import argparse


class FrozenRunError(AttributeError):
    """A write to the run description after validation."""


class RunDescription(argparse.Namespace):
    """``args`` after validation plus derived values; attributes cannot be set or deleted."""

    def __init__(self, args: argparse.Namespace, **derived):  # pylint: disable=super-init-not-called
        self.__dict__.update(vars(args))
        self.__dict__.update(derived)

    def __setattr__(self, name, value):
        raise FrozenRunError(
            f"args.{name} written after validation: derive it in "
            "megatron/varlen_training/run_description.py instead")

    def __delattr__(self, name):
        raise FrozenRunError(f"args.{name} deleted after validation")


def padded_vocab_size(vocab_size: int, divisible_by: int, tp_size: int) -> int:
    """Megatron's rule: pad the vocabulary to a multiple of divisible_by * tp."""
    multiple = divisible_by * tp_size
    return -(-vocab_size // multiple) * multiple


def sample_counts(args) -> tuple[int, int]:
    """(train, eval) samples the datasets must provide (eval: every evaluation point)."""
    train = args.train_iters * args.global_batch_size
    num_evals = args.train_iters // max(args.eval_interval, 1) + 1
    return train, num_evals * max(args.eval_iters, 0) * args.global_batch_size


def derive_run_values(args, vocab_size: int | None) -> dict:
    """The derived fields; ``padded_vocab_size`` is None while the vocabulary is unknown."""
    train_samples, eval_samples = sample_counts(args)
    padded = None if vocab_size is None else padded_vocab_size(
        vocab_size, args.make_vocab_size_divisible_by, args.tensor_model_parallel_size)
    return {"vocab_size": vocab_size, "padded_vocab_size": padded,
            "train_samples": train_samples, "eval_samples": eval_samples}


def describe_run(args, tokenizer_vocab_size: int) -> RunDescription:
    """The read-only description of the run; ``--vocab-size`` wins over the tokenizer's."""
    vocab_size = args.vocab_size if args.vocab_size is not None else tokenizer_vocab_size
    return RunDescription(args, **derive_run_values(args, vocab_size))
