"""Validation leaves the parsed namespace as it was: the same namespace validates twice to the
same run, iteration- and sample-based alike (the derived training-sample count once overwrote
``--train-samples`` in the input, and the second validation then refused "--train-iters and
--train-samples" as both given)."""

import pytest

from megatron.varlen_training.arguments import build_parser, validate_args
from megatron.varlen_training.hybrid_arguments import parse_hybrid_args
from tests.harness.training_runs import TINY_GPT_ARGS

LENGTHS = {"iterations": ["--train-iters", "5", "--lr-warmup-iters", "1"],
           "samples": ["--train-samples", "22", "--lr-warmup-samples", "4"]}


@pytest.mark.parametrize("kind", sorted(LENGTHS))
def test_the_same_namespace_validates_twice(kind):
    parsed = build_parser("pretrain_gpt.py").parse_args(TINY_GPT_ARGS + LENGTHS[kind])
    parsed.world_size = 1
    given = dict(vars(parsed))
    first = validate_args(parsed)
    assert vars(parsed) == given, "validation changed the namespace it was given"
    second = validate_args(parsed)
    assert vars(second) == vars(first)
    # the derived values are there, in the copies: 5 iterations of 4 samples, or 22 // 4
    assert (first.train_iters, first.train_samples) == \
        ((5, 20) if kind == "iterations" else (5, 22))


def test_hybrid_parser_keeps_the_derived_values():
    """pretrain_mamba.py's parser validates through the same function and uses its result."""
    args = parse_hybrid_args(["--num-layers", "2", "--hidden-size", "24",
                              "--num-attention-heads", "4", "--mamba-head-dim", "4",
                              "--mamba-num-groups", "2", "--mamba-state-dim", "8",
                              "--seq-length", "64", "--lr", "1e-3", "--mock-data",
                              "--vocab-size", "128", "--global-batch-size", "4"]
                             + LENGTHS["iterations"], world_size=1)
    assert (args.train_samples, args.data_parallel_size) == (20, 1)
