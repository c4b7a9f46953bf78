"""``args`` is not written after validation: derived values live in the run description."""

import argparse

import pytest

from megatron.varlen_training.arguments import parse_args
from megatron.varlen_training.run_description import FrozenRunError, RunDescription, describe_run
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import TINY_GPT_ARGS, train_on_this_rank


def test_derived_values_are_set_during_validation_and_the_description_is_read_only():
    args = parse_args(TINY_GPT_ARGS + ["--train-iters", "3", "--eval-iters", "2",
                                       "--eval-interval", "2"], world_size=1)
    # vocab 128 padded to a multiple of 32 * TP; eval at iterations 2 and the end (+1 at 0)
    assert (args.padded_vocab_size, args.train_samples, args.eval_samples) == (128, 12, 16)
    run = describe_run(args, tokenizer_vocab_size=1000)
    assert run.vocab_size == 128, "--vocab-size wins over the tokenizer's"
    with pytest.raises(FrozenRunError, match="args.lr written after validation"):
        run.lr = 1.0
    # A tokenizer-defined vocabulary (no --vocab-size) is padded when the tokenizer says it.
    no_vocab = argparse.Namespace(**{**vars(args), "vocab_size": None})
    described = describe_run(no_vocab, tokenizer_vocab_size=100)
    assert (described.vocab_size, described.padded_vocab_size) == (100, 128)


def _frozen_training(argv):
    import tests.harness.training_runs as testing

    # Freeze right after validation: any later write (a builder leaving a value in args for a
    # later reader) raises FrozenRunError and fails the run.
    parse = testing.parse_args
    testing.parse_args = lambda *a, **k: RunDescription(parse(*a, **k))
    try:
        return train_on_this_rank(argv)
    finally:
        testing.parse_args = parse


def test_tiny_packed_training_runs_on_frozen_args():
    argv = TINY_GPT_ARGS + ["--train-iters", "2", "--sequence-packing", "--sft",
                            "--micro-batch-size", "1",
                            "--eval-iters", "1", "--eval-interval", "1"]
    (result,) = run_distributed(_frozen_training, 1, args=(argv,), timeout_s=180)
    assert len(result["history"]) == 2 and result["owns_loss"]
