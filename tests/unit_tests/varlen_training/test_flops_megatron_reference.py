"""Our FLOPs on unpacked fixed-length batches == Megatron-LM's ``num_floating_point_operations``.

The reference below is Megatron-LM's ``transformer_flops`` (training.py, core_v0.16.1 and main)
re-derived term by term in exact rationals from the facts of that formula: 3 (forward, wgrad,
dgrad) x 2 (multiply-add) per GEMM entry; QKV of ``kv_channels`` x (heads + 2 groups) columns
(groups = heads unless --group-query-attention); output projection q x h; core attention
q x L^2 per sequence (causal half x QK^T and AV); MLP f x h x (3 if SwiGLU else 2); MoE layers
where --moe-layer-freq says, each with top-k experts of --moe-ffn-hidden-size and the shared
expert; each MTP depth one more layer, MoE iff the LAST decoder layer is (Megatron-LM builds
it from that layer's spec), plus 3h norms, the 2h x h eh projection and one more logit per
token. For a fixed-length batch of B samples of S tokens: sum L = B*S, sum L^2 = B*S^2.

One deliberate difference, pinned here: our MoE layers also count the router's h x E GEMM
(torch's FLOP counter sees it, test_moe_flops.py; Megatron-LM leaves it out).
"""

from fractions import Fraction

import pytest

from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.flops import num_floating_point_operations
from tests.harness.training_runs import TINY_GPT_ARGS

FWD_BWD, FMA = 3, 2
BATCH, SEQ = 4, 32  # TINY_GPT_ARGS' global batch and --seq-length
MOE = ["--disable-bias-linear", "--num-experts", "4", "--moe-router-topk", "2",
       "--moe-ffn-hidden-size", "24"]


def _megatron_lm_flops(a: dict, batch: int, seq: int) -> Fraction:
    """Megatron-LM's training FLOPs of one global batch (BSHD: every sample ``seq`` tokens)."""
    h, heads = a["hidden_size"], a["num_attention_heads"]
    groups = a["num_query_groups"] if a["group_query_attention"] else heads
    kv_channels = a["kv_channels"] or Fraction(h, heads)
    moe_pattern = _moe_pattern(a)
    mtp = a["mtp_num_layers"]
    num_moe = sum(moe_pattern) + (moe_pattern[-1] * mtp if moe_pattern else 0)
    num_dense = a["num_layers"] + mtp - num_moe
    layers = a["num_layers"] + mtp
    ffn_factor = 3 if a["swiglu"] else 2
    query, kv = kv_channels * heads, kv_channels * groups
    attention_linear = FWD_BWD * FMA * (h * (query + 2 * kv) + query * h)
    attention_core = FWD_BWD * FMA * query / 2 * 2
    moe_ffn = a["moe_ffn_hidden_size"] or a["ffn_hidden_size"]
    shared = a["moe_shared_expert_intermediate_size"] or 0
    mlp = FWD_BWD * FMA * h * (a["ffn_hidden_size"] * ffn_factor * num_dense
                               + moe_ffn * a["moe_router_topk"] * ffn_factor * num_moe
                               + shared * ffn_factor * num_moe)
    per_token = (mlp + attention_linear * layers
                 + FWD_BWD * FMA * mtp * (3 * h + 2 * h * h)
                 + FWD_BWD * FMA * h * a["padded_vocab_size"] * (mtp + 1))
    return batch * seq * per_token + batch * seq * seq * attention_core * layers


def _moe_pattern(a: dict) -> list[int]:
    if a["num_experts"] is None:
        return []
    freq = a["moe_layer_freq"]
    if isinstance(freq, int):
        return [1 if index % freq == 0 else 0 for index in range(a["num_layers"])]
    return list(freq)


def _flag_values(model) -> dict:
    """The flag values Megatron-LM's formula reads, from our parsed run."""
    moe = model.moe
    return dict(
        hidden_size=model.hidden_size, num_attention_heads=model.num_attention_heads,
        num_query_groups=model.num_query_groups,
        group_query_attention=model.group_query_attention,
        kv_channels=model.head_dim if model.head_dim * model.num_attention_heads
        != model.hidden_size else None,
        num_layers=model.num_layers, ffn_hidden_size=model.ffn_hidden_size,
        swiglu=model.swiglu, padded_vocab_size=model.padded_vocab_size,
        mtp_num_layers=model.mtp_num_layers or 0,
        num_experts=moe.num_experts if moe else None,
        moe_layer_freq=moe.moe_layer_freq if moe else 1,
        moe_router_topk=moe.moe_router_topk if moe else 0,
        moe_ffn_hidden_size=moe.moe_ffn_hidden_size if moe else None,
        moe_shared_expert_intermediate_size=(moe.moe_shared_expert_intermediate_size
                                             if moe else None))


def _router_flops(model, num_moe_layers: int, tokens: int) -> int:
    return FWD_BWD * FMA * model.hidden_size * model.moe.num_experts * num_moe_layers * tokens


def _model(extra: list[str]):
    return parse_run_config(TINY_GPT_ARGS + ["--train-iters", "1"] + extra, world_size=1).model


@pytest.mark.parametrize("extra", [
    [],
    ["--swiglu"],
    ["--group-query-attention", "--num-query-groups", "2"],
    ["--kv-channels", "12", "--group-query-attention", "--num-query-groups", "1"],
    ["--ffn-hidden-size", "40", "--untie-embeddings-and-output-weights"],
    ["--mtp-num-layers", "2", "--swiglu"],
    ["--recompute-granularity", "full", "--recompute-method", "uniform",
     "--recompute-num-layers", "1"],  # recomputation is not model work
])
def test_dense_gpt_equals_megatron_lm(extra):
    model = _model(extra)
    for batch, seq in ((BATCH, SEQ), (3, 1000), (1, 2 ** 17)):
        ours = num_floating_point_operations(model, batch * seq, batch * seq * seq)
        assert ours == _megatron_lm_flops(_flag_values(model), batch, seq), (extra, batch, seq)


@pytest.mark.parametrize("extra,num_moe_layers", [
    (MOE, 2),
    (MOE + ["--swiglu", "--moe-shared-expert-intermediate-size", "40"], 2),
    (MOE + ["--moe-layer-freq", "2", "--num-layers", "4"], 2),
    (MOE + ["--moe-layer-freq", "[0,1]"], 1),
    # MTP after an MoE last layer is an MoE layer, after a dense last layer a dense one
    (MOE + ["--moe-layer-freq", "[0,1]", "--mtp-num-layers", "1"], 2),
    (MOE + ["--moe-layer-freq", "[1,0]", "--mtp-num-layers", "2"], 1),
    (MOE + ["--moe-layer-freq", "2", "--num-layers", "4", "--mtp-num-layers", "1"], 2),
])
def test_moe_gpt_equals_megatron_lm_plus_router(extra, num_moe_layers):
    model = _model(extra)
    for batch, seq in ((BATCH, SEQ), (3, 1000)):
        tokens = batch * seq
        ours = num_floating_point_operations(model, tokens, tokens * seq)
        upstream = _megatron_lm_flops(_flag_values(model), batch, seq)
        assert ours - upstream == _router_flops(model, num_moe_layers, tokens), (extra, seq)
