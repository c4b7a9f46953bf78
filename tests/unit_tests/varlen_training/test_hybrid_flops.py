"""Hybrid FLOPs: attention layers are the only quadratic term; Mamba layers count sum(L).

Checked three independent ways: (1) a pattern of one attention and one MLP layer equals the GPT
formula of one transformer layer (flops.py, a separate code path); (2) the Mamba projections
equal what torch's FLOP counter measures on a real forward of the mixer; (3) the conv and scan
terms against a hand count, and no sum(L^2) dependence without attention layers.
"""

from types import SimpleNamespace

import torch
from torch.utils.flop_counter import FlopCounterMode

from megatron.core import parallel_state
from megatron.varlen_training.flops import num_floating_point_operations as gpt_flops
from megatron.varlen_training.hybrid_flops import mamba_layer_macs
from megatron.varlen_training.hybrid_model import HYBRID
from tests.harness.multirank import run_distributed
from tests.unit_tests.varlen.mamba import test_mixer


HYBRID_FIELDS = ("hybrid_layer_pattern", "mamba_state_dim", "mamba_head_dim",
                 "mamba_num_groups", "mamba_num_heads_resolved")


def _args(pattern, **overrides):
    """A stand-in model config (the fields the FLOPs formulas read); hybrid_layer_pattern=None:
    a GPT model."""
    values = dict(hidden_size=24, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=96,
                  swiglu=False, gated_mlp=False, padded_vocab_size=128,
                  num_layers=len(pattern),
                  hybrid_layer_pattern=pattern, mamba_state_dim=8, mamba_head_dim=4,
                  mamba_num_groups=2, mamba_num_heads_resolved=12, mtp_num_layers=None,
                  moe=None, mla=None, window_size=None, window_attn_skip_freq=None)
    values.update(overrides)
    values["head_dim"] = values["hidden_size"] // values["num_attention_heads"]
    hybrid = {name: values.pop(name) for name in HYBRID_FIELDS}
    return SimpleNamespace(**values, hybrid=SimpleNamespace(**hybrid)
                           if hybrid["hybrid_layer_pattern"] else None)


def test_attention_plus_mlp_equals_one_gpt_layer():
    hybrid = _args("*-")
    gpt = _args("*-", num_layers=1, hybrid_layer_pattern=None)
    for sums in [(100, 2000), (37, 37), (1000, 250000)]:
        assert HYBRID.flops(hybrid, *sums) == gpt_flops(gpt, *sums)


def test_mamba_only_model_is_linear_in_length():
    args = _args("MM")
    assert HYBRID.flops(args, 100, 100) == \
        HYBRID.flops(args, 100, 10_000)
    assert HYBRID.flops(args, 200, 1) == \
        2 * HYBRID.flops(args, 100, 1)


def test_conv_and_scan_hand_count():
    # d_inner 48, B and C 2 groups x 8 states each; width-4 depthwise conv over x, B, C;
    # scan: decay, update, readout = 3 MACs per state entry per channel.
    macs = mamba_layer_macs(_args("M"))
    assert macs["conv"] == (48 + 2 * 16) * 4
    assert macs["scan"] == 3 * 48 * 8
    # Training total: 3 x 2 x (Mamba layer + logits) x sum(L).
    total = sum(macs.values()) + 24 * 128
    assert HYBRID.flops(_args("M"), 10, 1) == 3 * 2 * total * 10


def rank_measured_projection_flops():
    parallel_state.initialize_model_parallel()
    try:
        mixer = test_mixer.build_mixer()
        hidden, params, _ = test_mixer.packed_inputs()
        counter = FlopCounterMode(display=False)
        with counter:
            mixer(hidden, packed_seq_params=params)
        by_module = counter.get_flop_counts()
        measured = {part: sum(by_module.get(f"VarlenMambaMixer.{part}", {}).values())
                    for part in ("in_proj", "out_proj")}
        return measured, hidden.size(0)
    finally:
        parallel_state.destroy_model_parallel()


def test_projection_flops_match_torch_flop_counter():
    (measured, tokens), = run_distributed(rank_measured_projection_flops, 1, timeout_s=60)
    args = _args("M", hidden_size=test_mixer.HIDDEN, mamba_state_dim=test_mixer.STATE,
                 mamba_head_dim=test_mixer.HEAD_DIM, mamba_num_groups=test_mixer.GROUPS,
                 mamba_num_heads_resolved=2 * test_mixer.HIDDEN // test_mixer.HEAD_DIM)
    macs = mamba_layer_macs(args)
    for part in ("in_proj", "out_proj"):
        assert measured[part] == 2 * macs[part] * tokens, (part, measured, macs)
