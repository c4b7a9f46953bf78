"""Model FLOPs and the scheduler's cost model under --window-size: a windowed layer counts
m*(2L - m), m = min(L, LEFT + 1), where a full one counts L^2 (attention_area.py).

References, none taken from the code under test: the query-key pairs a boolean mask allows,
counted by brute force (squared tokens = 2*pairs - m, the convention that makes full causal
attention L^2 = 2*pairs - L); the layers windowed counted by hand from megatron-core's rule;
and the no-window formula (itself checked against Megatron-LM and torch's FLOP counter).
"""

import dataclasses

import numpy as np
import pytest

from megatron.varlen.scheduling import attention_area, length_sums
from megatron.varlen_training.config.from_flags import parse_hybrid_run_config, parse_run_config
from megatron.varlen_training.data import build_packing_config
from megatron.varlen_training.flops import FORWARD_AND_BACKWARD, num_floating_point_operations
from megatron.varlen_training.hybrid_model import HYBRID
from megatron.varlen_training.model_family import GPT
from tests.harness.training_runs import TINY_GPT_ARGS

LENGTHS = (1, 2, 5, 6, 7, 13, 40, 64)
# M*M*- : attention at positions 2 and 4; the list windows position 4 only
HYBRID_ARGV = [
    "--num-layers", "5", "--hybrid-override-pattern", "M*M*-", "--hidden-size", "32",
    "--num-attention-heads", "4", "--seq-length", "64", "--max-position-embeddings", "64",
    "--micro-batch-size", "1", "--global-batch-size", "1", "--train-iters", "1",
    "--tokenizer-type", "NullTokenizer", "--vocab-size", "127", "--mock-data", "--lr", "1e-3",
    "--mamba-num-groups", "1", "--window-size", "4,0", "--window-attn-skip-freq", "[0,0,0,1,0]",
]
WINDOWS = (0, 1, 4, 5, 6, 30, 100)


def _pairs(length: int, window: int | None) -> int:
    """Query-key pairs causal attention over ``length`` tokens allows through a left window
    (query i sees keys i - window .. i), counted from the mask."""
    query = np.arange(length)[:, None]
    key = np.arange(length)[None, :]
    allowed = key <= query
    if window is not None:
        allowed &= key >= query - window
    return int(allowed.sum())


@pytest.mark.parametrize("window", WINDOWS)
def test_area_is_twice_the_mask_pairs_less_the_band_width(window):
    for length in LENGTHS:
        band = min(length, window + 1)
        assert attention_area(length, window) == 2 * _pairs(length, window) - band
        assert attention_area(length, None) == 2 * _pairs(length, None) - length == length ** 2
    as_array = attention_area(np.array(LENGTHS), window)
    assert as_array.tolist() == [attention_area(n, window) for n in LENGTHS]


def test_length_sums_are_exact_and_windowed_only_with_a_window():
    big = 2 ** 40 + 3
    assert length_sums([big, 3], None) == (big + 3, big * big + 9, None)
    assert length_sums([big, 3], 7) == (big + 3, big * big + 9,
                                        8 * (2 * big - 8) + 9)


def _gpt(*flags):
    argv = TINY_GPT_ARGS + ["--train-iters", "1", "--num-layers", "4", *flags]
    return parse_run_config(argv, world_size=1).model


def _windowed_sum(lengths, window):
    return sum(2 * _pairs(n, window) - min(n, window + 1) for n in lengths)


@pytest.mark.parametrize("flags, windowed_layers", [
    (("--window-attn-skip-freq", "2"), 2),          # 4 layers: 1 and 3; the MTP depth is 5
    (("--window-attn-skip-freq", "2", "--mtp-num-layers", "1"), 3),
    ((), 4),
    (("--window-attn-skip-freq", "[0,0,1,0]"), 1),
])
def test_gpt_windowed_layers_count_the_windowed_sum(flags, windowed_layers):
    lengths, window = (3, 9, 17, 40), 5
    windowed = _gpt("--window-size", f"{window},0", *flags)
    full = dataclasses.replace(windowed, window_size=None, window_attn_skip_freq=None)
    total, squares = sum(lengths), sum(n * n for n in lengths)
    q = windowed.num_attention_heads * windowed.head_dim
    got = num_floating_point_operations(windowed, total, squares, _windowed_sum(lengths, window))
    saved = FORWARD_AND_BACKWARD * 2 * q * windowed_layers * (
        squares - _windowed_sum(lengths, window))
    assert saved > 0
    assert got == num_floating_point_operations(full, total, squares) - saved


def test_without_a_bounded_window_nothing_changes():
    plain = _gpt()
    for model in (plain, _gpt("--window-size=-1,0")):
        assert num_floating_point_operations(model, 70, 1900, None) == \
            num_floating_point_operations(plain, 70, 1900)


def test_windowed_layers_without_the_windowed_sum_are_refused():
    with pytest.raises(ValueError, match="window-size 5,0"):
        num_floating_point_operations(_gpt("--window-size", "5,0"), 70, 1900)


def test_hybrid_attention_layers_are_windowed_by_their_pattern_position():
    """Only the attention layer at pattern position 4 is windowed."""
    windowed = parse_hybrid_run_config(HYBRID_ARGV, world_size=1).model
    full = dataclasses.replace(windowed, window_size=None, window_attn_skip_freq=None)
    lengths = (2, 11, 30)
    total, squares = sum(lengths), sum(n * n for n in lengths)
    window_sum = _windowed_sum(lengths, 4)
    q = windowed.num_attention_heads * windowed.head_dim
    saved = FORWARD_AND_BACKWARD * 2 * q * 1 * (squares - window_sum)
    assert HYBRID.flops(windowed, total, squares, window_sum) == \
        HYBRID.flops(full, total, squares) - saved
    # the attention term alone, by hand: one full layer (position 2), one windowed (4)
    attention = FORWARD_AND_BACKWARD * 2 * q * (squares + window_sum)
    assert HYBRID.flops(windowed, total, squares, window_sum) == \
        HYBRID.flops(windowed, total, 0, 0) + attention


def _scheduler_cost(model_run, family):
    config = build_packing_config(model_run, 0, family.attention_layers(model_run.model))
    return config.cost


def test_the_scheduler_prices_the_windowed_share_of_attention_layers():
    """GPT: layers 1 and 3 of 4 windowed; hybrid M*M*-: 2 attention layers of 5, one windowed.
    A length's price is the full model's less, per windowed layer share, P^2 - the window's
    squared tokens (counted from the mask)."""
    gpt = parse_run_config(TINY_GPT_ARGS + ["--train-iters", "1", "--num-layers", "4",
                                            "--sequence-packing", "--micro-batch-size", "1",
                                            "--window-size", "5,0",
                                            "--window-attn-skip-freq", "2"], world_size=1)
    hybrid = parse_hybrid_run_config(HYBRID_ARGV + ["--sequence-packing"], world_size=1)
    for run, family, share in ((gpt, GPT, 2 / 4), (hybrid, HYBRID, 1 / 5)):
        window = run.model.window_size[0]
        cost = _scheduler_cost(run, family)
        plain = dataclasses.replace(run, model=dataclasses.replace(
            run.model, window_size=None, window_attn_skip_freq=None))
        full = _scheduler_cost(plain, family)
        assert full.a_window == 0.0
        for length in (1, 6, 7, 50, 300):
            saved = share * (length ** 2 - _windowed_sum([length], window))
            assert cost.time(length, 1) == pytest.approx(full.time(length, 1) - saved,
                                                         rel=1e-12)
