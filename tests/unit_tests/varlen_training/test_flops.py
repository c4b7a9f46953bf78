"""FLOPs from real lengths, checked against torch's own FLOP counter on a real forward pass.

The reference counts every matmul the model actually runs (torch.utils.flop_counter). Our
plain-torch attention computes the full L x L score matrix and masks it, i.e. twice the causal
work the formula charges, so the reference is compared with the formula's forward FLOPs with
the attention term doubled. Two lengths pin both the sum(L) and the sum(L^2) coefficients.
A THD pack of three sequences is counted too: it costs what its sequences cost one by one.
"""

import dataclasses

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.flops import FORWARD_AND_BACKWARD, num_floating_point_operations
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import TINY_GPT_ARGS

LENGTHS = (16, 32)


def _forward_flops(argv, length):
    """Forward FLOPs torch counts for one ``length``-token sample, and the padded vocabulary
    (test_flops_mtp.py uses it too)."""
    from megatron.core import parallel_state
    from megatron.varlen_training.initialize import initialize_model_parallel, set_random_seeds
    from megatron.varlen_training.model import build_model, build_transformer_config

    run = parse_run_config(argv, world_size=1)
    initialize_model_parallel(run.parallel)
    set_random_seeds(run.training.seed)
    try:
        model = build_model(run, build_transformer_config(run))[0]
        # (MTP's token roll needs a loss mask; ids and the mask change no matmul's size)
        tokens = torch.randint(0, 64, (1, length))
        positions = torch.arange(length).unsqueeze(0)
        counter = FlopCounterMode(display=False)
        with counter, torch.no_grad():
            model(tokens, positions, None, labels=tokens, loss_mask=torch.ones(1, length))
        return counter.get_total_flops(), run.model.padded_vocab_size
    finally:
        parallel_state.destroy_model_parallel()


def forward_flops_each(argv, lengths):
    """:func:`_forward_flops` of each length, in one launch (test_moe_flops.py uses it too)."""
    return [_forward_flops(argv, length) for length in lengths]


# --kv-channels 12: heads narrower than hidden / heads (Qwen3-style), so q_dim != hidden size.
@pytest.mark.parametrize("swiglu,kv_channels", [(False, None), (True, None), (False, 12)])
def test_formula_matches_counted_matmuls(swiglu, kv_channels):
    argv = TINY_GPT_ARGS + ["--train-iters", "1", "--num-query-groups", "2",
                            "--group-query-attention"] + (["--swiglu"] if swiglu else []) \
        + (["--kv-channels", str(kv_channels)] if kv_channels else [])
    counts = run_distributed(forward_flops_each, 1, args=(argv, LENGTHS), timeout_s=120)[0]
    for length, (counted, padded_vocab) in zip(LENGTHS, counts):
        model = parse_run_config(argv, world_size=1).model
        model = dataclasses.replace(model, padded_vocab_size=padded_vocab)
        train = num_floating_point_operations(model, length, length * length)
        causal_attention = num_floating_point_operations(model, 0, length * length)
        expected_forward = (train + causal_attention) / FORWARD_AND_BACKWARD
        assert counted == pytest.approx(expected_forward, rel=1e-9), (length, counted)


def test_sums_are_exact_integers():
    model = parse_run_config(TINY_GPT_ARGS + ["--train-iters", "1"], world_size=1).model
    assert model.padded_vocab_size == 128
    big = 2 ** 40 + 1  # float32 would round this (exact above 2^24 only as an integer)
    assert isinstance(num_floating_point_operations(model, big, big * big), int)


PACK = (5, 11, 16)  # three sequences packed into one THD micro-batch


def _packed_forward_flops(argv, lengths):
    """Forward FLOPs torch counts for one THD pack of ``lengths`` (no padding)."""
    from megatron.core import parallel_state
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.varlen_training.initialize import initialize_model_parallel, set_random_seeds
    from megatron.varlen_training.model import build_model, build_transformer_config

    run = parse_run_config(argv, world_size=1)
    initialize_model_parallel(run.parallel)
    set_random_seeds(run.training.seed)
    try:
        model = build_model(run, build_transformer_config(run))[0]
        total = sum(lengths)
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                                 cu_seqlens_q_padded=cu, cu_seqlens_kv_padded=cu,
                                 max_seqlen_q=max(lengths), max_seqlen_kv=max(lengths))
        tokens = torch.randint(0, 64, (1, total))
        positions = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
        counter = FlopCounterMode(display=False)
        with counter, torch.no_grad():
            model(tokens, positions, None, labels=tokens, loss_mask=torch.ones(1, total),
                  packed_seq_params=params)
        return counter.get_total_flops()
    finally:
        parallel_state.destroy_model_parallel()


def _pack_and_alone(argv, lengths):
    """(the pack's counted forward FLOPs, each sequence's counted alone), in one launch."""
    return (_packed_forward_flops(argv, lengths),
            [_forward_flops(argv, length) for length in lengths])


def test_packing_changes_only_the_attention_sums():
    """A pack costs what its sequences cost one by one (torch counts both), and the formula
    fed sum(L) and sum(L^2) of the pack gives it: nothing but the per-sequence L^2 depends on
    how tokens are grouped."""
    argv = TINY_GPT_ARGS + ["--train-iters", "1", "--sequence-packing", "--micro-batch-size",
                            "1", "--swiglu", "--group-query-attention", "--num-query-groups",
                            "2", "--position-embedding-type", "rope"]
    packed, alone = run_distributed(_pack_and_alone, 1, args=(argv, PACK), timeout_s=120)[0]
    assert packed == sum(counted for counted, _ in alone)
    model = dataclasses.replace(parse_run_config(argv, world_size=1).model,
                                padded_vocab_size=alone[0][1])
    seqlen_sum, squared_sum = sum(PACK), sum(n * n for n in PACK)
    train = num_floating_point_operations(model, seqlen_sum, squared_sum)
    causal_attention = num_floating_point_operations(model, 0, squared_sum)
    assert packed == pytest.approx((train + causal_attention) / FORWARD_AND_BACKWARD, rel=1e-9)
    whole = num_floating_point_operations(model, seqlen_sum, seqlen_sum ** 2)
    assert whole > train  # one sequence of the pack's length would be charged more
