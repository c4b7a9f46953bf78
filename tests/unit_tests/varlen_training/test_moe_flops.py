"""MoE FLOPs count the router and the ACTIVATED experts (top-k routed + shared).

Two independent references: torch's FLOP counter on a real forward pass of an MoE GPT (the
plain-torch experts run exactly the tokens routed to them, so the counter sees k expert MLPs
per token), and the formula written out by hand for one configuration. The scheduler's linear
cost coefficient follows the same count.
"""

import dataclasses

import pytest

from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.data import build_packing_config
from megatron.varlen_training.flops import FORWARD_AND_BACKWARD, num_floating_point_operations
from megatron.varlen_training.moe_flops import linear_cost_scale
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import TINY_GPT_ARGS
from tests.unit_tests.varlen_training.test_flops import forward_flops_each

MOE = ["--train-iters", "1", "--disable-bias-linear", "--num-experts", "4",
       "--moe-router-topk", "2", "--moe-ffn-hidden-size", "24",
       "--moe-shared-expert-intermediate-size", "40"]


# With MTP the real model decides whether its MTP layer is MoE (after an MoE last layer) or
# dense (after a dense one, as Megatron-LM builds it); the counter sees which it built.
@pytest.mark.parametrize("extra", [
    [], ["--swiglu", "--moe-layer-freq", "[0,1]"],
    ["--moe-layer-freq", "[1,0]", "--mtp-num-layers", "1", "--position-embedding-type", "rope"],
    ["--moe-layer-freq", "[0,1]", "--mtp-num-layers", "1", "--position-embedding-type", "rope"],
])
def test_formula_matches_counted_matmuls(extra):
    argv = TINY_GPT_ARGS + MOE + extra
    lengths = (16, 32)
    counts = run_distributed(forward_flops_each, 1, args=(argv, lengths), timeout_s=120)[0]
    for length, (counted, padded_vocab) in zip(lengths, counts):
        model = dataclasses.replace(parse_run_config(argv, world_size=1).model,
                                    padded_vocab_size=padded_vocab)
        train = num_floating_point_operations(model, length, length * length)
        causal_attention = num_floating_point_operations(model, 0, length * length)
        # the formula's MTP norms (3h per token and depth) are not matmuls: not counted
        norms = 2 * 3 * model.hidden_size * length * (model.mtp_num_layers or 0)
        # our reference attention builds the full L x L score matrix: twice the causal work
        expected_forward = (train + causal_attention) / FORWARD_AND_BACKWARD - norms
        assert counted == pytest.approx(expected_forward, rel=1e-9), (length, counted)


def test_formula_by_hand():
    model = parse_run_config(TINY_GPT_ARGS + MOE, world_size=1).model
    model = dataclasses.replace(model, padded_vocab_size=128)
    h, layers, vocab, seq_sum, sq_sum = 32, 2, 128, 1000, 123456
    attention_linear = h * 3 * h + h * h                 # QKV (MHA) + output projection
    router = h * 4
    expert = h * 24 + 24 * h                             # GELU MLP, f_e = 24
    shared = h * 40 + 40 * h
    per_token = layers * (attention_linear + router + 2 * expert + shared) + h * vocab
    expected = 3 * 2 * (per_token * seq_sum + h * sq_sum * layers)
    assert num_floating_point_operations(model, seq_sum, sq_sum) == expected


def test_scheduler_linear_coefficient_follows_activated_experts():
    run = parse_run_config(TINY_GPT_ARGS + MOE + ["--sequence-packing", "--micro-batch-size",
                                                  "1"], world_size=1)
    dense = parse_run_config(TINY_GPT_ARGS + ["--train-iters", "1", "--disable-bias-linear",
                                              "--sequence-packing", "--micro-batch-size", "1"],
                             world_size=1)
    h = 32
    attention_linear, dense_mlp = 4 * h * h, 2 * h * 4 * h
    moe_mlp = h * 4 + 2 * (2 * h * 24) + 2 * h * 40
    assert linear_cost_scale(run.model) == pytest.approx(
        (attention_linear + moe_mlp) / (attention_linear + dense_mlp), rel=1e-12)
    b_moe = build_packing_config(run, pad_id=0).cost.b
    b_dense = build_packing_config(dense, pad_id=0).cost.b
    assert b_moe == pytest.approx(b_dense * linear_cost_scale(run.model), rel=1e-12)
    assert linear_cost_scale(dense.model) == 1.0
