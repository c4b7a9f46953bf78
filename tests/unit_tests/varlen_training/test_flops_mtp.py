"""Multi-token prediction layers in the FLOPs.

Two independent references: Megatron-LM's own ``transformer_flops`` formula, written out here
term by term in exact rationals (MTP depths are extra layers, plus 3h + 2h^2 per token for their
norms and eh projection, plus one more logit per depth), and torch's FLOP counter on a real
forward pass of a model with MTP (which counts matmuls only: the formula's MTP norm term is
left out of that comparison, and our plain-torch attention computes the full L x L scores, so
the causal attention term is doubled, as in test_flops.py).
"""

import dataclasses
from fractions import Fraction

import pytest

from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.flops import FORWARD_AND_BACKWARD, num_floating_point_operations
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import TINY_GPT_ARGS
from tests.unit_tests.varlen_training.test_flops import _forward_flops

LENGTH = 16


def _model(extra):
    return parse_run_config(TINY_GPT_ARGS + ["--train-iters", "1"] + extra, world_size=1).model


def _upstream_transformer_flops(model, mtp: int, total_tokens: int, seqlen_squared_sum: int):
    """Megatron-LM's ``num_floating_point_operations`` (dense GPT, MHA/GQA), exact rationals."""
    fwd_bwd, fma = 3, 2
    h, heads = model.hidden_size, model.num_attention_heads
    kv_channels = Fraction(h, heads)
    ffn_expansion = 3 if model.swiglu else 2
    num_layers = model.num_layers + mtp  # MTP depths count as dense layers
    query = kv_channels * heads
    key = value = kv_channels * model.num_query_groups
    self_attn = fwd_bwd * fma * (h * (query + key + value) + query * h)
    core = fwd_bwd * fma * query / 2 * 2
    per_token = (fwd_bwd * fma * h * model.ffn_hidden_size * ffn_expansion * num_layers
                 + self_attn * num_layers
                 + fwd_bwd * fma * mtp * (3 * h + 2 * h * h)
                 + fwd_bwd * fma * h * model.padded_vocab_size * (mtp + 1))
    return total_tokens * per_token + seqlen_squared_sum * core * num_layers


@pytest.mark.parametrize("mtp", [1, 2])
@pytest.mark.parametrize("extra", [[], ["--swiglu", "--num-query-groups", "2",
                                        "--group-query-attention"]])
def test_mtp_flops_equal_megatron_lm_formula(mtp, extra):
    model = _model(extra + ["--mtp-num-layers", str(mtp)])
    for total, squares in ((LENGTH, LENGTH ** 2), (1000, 123_457), (2 ** 40 + 3, 2 ** 61 + 5)):
        ours = num_floating_point_operations(model, total, squares)
        assert isinstance(ours, int)
        assert ours == _upstream_transformer_flops(model, mtp, total, squares)


def test_each_mtp_depth_adds_one_layer_its_projection_norms_and_logits():
    """The increment of one depth, by hand: a layer, 2h^2 + 3h, h*V per token; q per L^2."""
    base = _model([])
    deeper = dataclasses.replace(base, mtp_num_layers=1)
    h, V = base.hidden_size, base.padded_vocab_size
    f, q = base.ffn_hidden_size, base.hidden_size  # MHA: q = kv = h
    layer = h * 3 * q + q * h + 2 * h * f
    per_token = 2 * (layer + 2 * h * h + 3 * h + h * V)
    per_square = 2 * q
    delta = (num_floating_point_operations(deeper, 7, 11)
             - num_floating_point_operations(base, 7, 11))
    assert delta == FORWARD_AND_BACKWARD * (7 * per_token + 11 * per_square)
    assert num_floating_point_operations(dataclasses.replace(base, mtp_num_layers=None), 7, 11) \
        == num_floating_point_operations(base, 7, 11)


def test_mtp_formula_matches_counted_matmuls():
    argv = TINY_GPT_ARGS + ["--train-iters", "1", "--mtp-num-layers", "1",
                            "--position-embedding-type", "rope"]
    counted, padded_vocab = run_distributed(_forward_flops, 1, args=(argv, LENGTH),
                                            timeout_s=120)[0]
    model = dataclasses.replace(parse_run_config(argv, world_size=1).model,
                                padded_vocab_size=padded_vocab)
    train = num_floating_point_operations(model, LENGTH, LENGTH ** 2)
    causal_attention = num_floating_point_operations(model, 0, LENGTH ** 2)
    norms = 2 * 3 * model.hidden_size * LENGTH * FORWARD_AND_BACKWARD  # not matmuls
    expected_forward = Fraction(train + causal_attention - norms, FORWARD_AND_BACKWARD)
    assert counted == pytest.approx(float(expected_forward), rel=1e-9)
