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
    moe, hybrid = model.moe, model.hybrid
    mamba = (dict(mamba_state_dim=hybrid.mamba_state_dim,
                  mamba_num_groups=hybrid.mamba_num_groups) if hybrid else {})
    return dict(**mamba,
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


# Hybrid models: Megatron-LM's ``hybrid_flops`` per layer type. Attention, MLP, MoE (without its
# router) and the logits are the GPT terms above; its Mamba layer is an estimate: in-projection
# 2h(2 d_in + 2gn + heads), scan 7 d_in n, out-projection 2 d_in h per token, with d_in = 2h
# whatever --mamba-num-heads says, and no convolution. Ours counts the mixer that is built
# (d_inner = heads x head_dim, test_hybrid_flops.py checks the projections against torch's FLOP
# counter): the depthwise conv 2 (d_inner + 2gn) w and the scan 3 x 2 d_inner n (decay, update,
# readout). The difference is pinned term by term.
HYBRID = ["--hidden-size", "32", "--mamba-head-dim", "8", "--mamba-num-groups", "2",
          "--mamba-state-dim", "16"]
CONV_WIDTH = 4  # megatron-core's MambaMixer d_conv


def _megatron_lm_hybrid_flops(a: dict, pattern: str, heads: int, batch: int, seq: int):
    """Megatron-LM's training FLOPs of a hybrid model (BSHD, unpacked)."""
    dense = dict(a, num_layers=pattern.count("*"), mtp_num_layers=0, num_experts=None,
                 ffn_hidden_size=0)  # the attention layers' terms and the logits
    attention_and_logits = _megatron_lm_flops(dense, batch, seq)
    h, n, g = a["hidden_size"], a["mamba_state_dim"], a["mamba_num_groups"]
    d_in, tokens = 2 * h, batch * seq
    mamba = (2 * tokens * h * (2 * d_in + 2 * g * n + heads) + 7 * tokens * d_in * n
             + 2 * tokens * d_in * h)
    scale = Fraction(3, 2) if a["swiglu"] else 1
    mlp = 4 * tokens * h * a["ffn_hidden_size"] * scale
    moe = 4 * tokens * h * scale * ((a["moe_ffn_hidden_size"] or a["ffn_hidden_size"])
                                    * a["moe_router_topk"]
                                    + (a["moe_shared_expert_intermediate_size"] or 0))
    return attention_and_logits + FWD_BWD * (pattern.count("M") * mamba + pattern.count("-") * mlp
                                             + pattern.count("E") * moe)


def _hybrid_model(pattern: str, extra: list[str]):
    from megatron.varlen_training.config.from_flags import parse_hybrid_run_config

    argv = (TINY_GPT_ARGS + ["--train-iters", "1", "--num-layers", str(len(pattern)),
                             "--hybrid-override-pattern", pattern] + HYBRID + extra)
    return parse_hybrid_run_config(argv, world_size=1).model


@pytest.mark.parametrize("pattern,extra", [
    ("M*-", []),
    ("M*M-", ["--swiglu", "--group-query-attention", "--num-query-groups", "2"]),
    ("*-", ["--kv-channels", "12"]),
    ("MM*", ["--mamba-num-heads", "4"]),  # d_inner 32, not Megatron-LM's assumed 2h = 64
    ("M*E-", MOE + ["--swiglu", "--moe-shared-expert-intermediate-size", "40"]),
])
def test_hybrid_equals_megatron_lm_except_the_mamba_estimate(pattern, extra):
    from megatron.varlen_training.hybrid_flops import hybrid_floating_point_operations

    model = _hybrid_model(pattern, extra)
    hybrid = model.hybrid
    h, n, g = model.hidden_size, hybrid.mamba_state_dim, hybrid.mamba_num_groups
    heads = hybrid.mamba_num_heads_resolved
    d_inner, assumed = heads * hybrid.mamba_head_dim, 2 * h
    # per token and Mamba layer, forward: ours minus Megatron-LM's
    in_proj = 2 * h * 2 * (d_inner - assumed)
    out_proj = 2 * (d_inner - assumed) * h
    conv = 2 * (d_inner + 2 * g * n) * CONV_WIDTH
    scan = 6 * d_inner * n - 7 * assumed * n
    per_token = in_proj + out_proj + conv + scan
    for batch, seq in ((BATCH, SEQ), (3, 1000)):
        tokens = batch * seq
        ours = hybrid_floating_point_operations(model, tokens, tokens * seq)
        upstream = _megatron_lm_hybrid_flops(_flag_values(model), pattern, heads, batch, seq)
        router = _router_flops(model, pattern.count("E"), tokens) if model.moe else 0
        assert ours - upstream == FWD_BWD * pattern.count("M") * per_token * tokens + router, \
            pattern


# Multi-latent attention: Megatron-LM's MLA branch of ``transformer_flops`` (main; THD batches
# count the core attention over sum L^2 of the real sequences). Per token: queries h n (d + r)
# directly, or q_rank (h + n (d + r) + 1) through the latent (+1: its norm); the key/value
# latent c (h + n (d + e) + 1) + h r; the output n e h. Core attention per L^2: (n (d + r) / 2
# + n e / 2), times 3 x 2 like every term. Everything else (MLP, MoE, MTP, logits) as above.
MLA = ["--multi-latent-attention", "--kv-lora-rank", "12", "--qk-head-dim", "10",
       "--qk-pos-emb-head-dim", "6", "--v-head-dim", "14"]
REAL_LENGTHS = [1, 7, 32, 19, 5, 1000, 333]  # one packed global batch's real sequences


def _megatron_lm_mla_flops(a: dict, m: dict, lengths: list[int]) -> Fraction:
    """Megatron-LM's training FLOPs of a global batch of sequences ``lengths`` (MLA model)."""
    h, n = a["hidden_size"], a["num_attention_heads"]
    q_head = m["qk_head_dim"] + m["qk_pos_emb_head_dim"]
    q_term = (h * n * q_head if m["q_lora_rank"] is None
              else m["q_lora_rank"] * (h + n * q_head + 1))
    attention_linear = FWD_BWD * FMA * (
        q_term + m["kv_lora_rank"] * (h + n * (m["qk_head_dim"] + m["v_head_dim"]) + 1)
        + h * m["qk_pos_emb_head_dim"] + n * m["v_head_dim"] * h)
    attention_core = FWD_BWD * FMA * (Fraction(n * q_head, 2) + Fraction(n * m["v_head_dim"], 2))
    layers = a["num_layers"] + a["mtp_num_layers"]
    # the rest of the formula: the standard attention terms of a model without attention
    rest = dict(a, hidden_size=h)
    tokens, squares = sum(lengths), sum(length * length for length in lengths)
    no_attention = _megatron_lm_flops(rest, 1, 1) - _standard_attention_flops(rest, 1, 1)
    return (no_attention * tokens + attention_linear * layers * tokens
            + attention_core * layers * squares)


def _standard_attention_flops(a: dict, batch: int, seq: int) -> Fraction:
    """The attention terms (linear and core) of :func:`_megatron_lm_flops`."""
    h, heads = a["hidden_size"], a["num_attention_heads"]
    groups = a["num_query_groups"] if a["group_query_attention"] else heads
    kv_channels = a["kv_channels"] or Fraction(h, heads)
    query, kv = kv_channels * heads, kv_channels * groups
    layers = a["num_layers"] + a["mtp_num_layers"]
    linear = FWD_BWD * FMA * (h * (query + 2 * kv) + query * h)
    return (batch * seq * linear + batch * seq * seq * FWD_BWD * FMA * query) * layers


def _mla_values(model) -> dict:
    mla = model.mla
    return dict(q_lora_rank=mla.q_lora_rank, kv_lora_rank=mla.kv_lora_rank,
                qk_head_dim=mla.qk_head_dim, qk_pos_emb_head_dim=mla.qk_pos_emb_head_dim,
                v_head_dim=mla.v_head_dim)


@pytest.mark.parametrize("extra,num_moe_layers", [
    (MLA, 0),
    (MLA + ["--q-lora-rank", "20", "--swiglu"], 0),
    (MLA + ["--q-lora-rank", "20", "--mtp-num-layers", "1"], 0),
    (MLA + MOE + ["--moe-layer-freq", "[0,1]"], 1),
])
def test_mla_gpt_equals_megatron_lm_on_real_lengths(extra, num_moe_layers):
    model = _model(extra)
    tokens, squares = sum(REAL_LENGTHS), sum(length * length for length in REAL_LENGTHS)
    ours = num_floating_point_operations(model, tokens, squares)
    upstream = _megatron_lm_mla_flops(_flag_values(model), _mla_values(model), REAL_LENGTHS)
    router = _router_flops(model, num_moe_layers, tokens) if model.moe else 0
    assert ours - upstream == router, extra
