"""The flash backend on CPU: attention plan + the kernel's plain-torch twin == the reference.

The reference is :func:`varlen_attention` (VarlenCoreAttention's math: one score matrix per
sequence at global positions), itself checked against a float64 per-sequence softmax in
test_core_attention.py. CP is emulated on one process: every rank's plan is applied to its
shard with the rank-ordered concatenation of all shards as K/V (what the all-gather returns),
and autograd through the splits sums the K/V gradients as the collective's backward does. A
gloo run at the end checks the real collective.
Shape legend: T = packed padded tokens, N = query heads, G = kv groups, D = head dim.
"""

import functools
import math

import pytest
import torch
import torch.distributed as dist
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.enums import AttnMaskType

from megatron.varlen.attention import LOCAL_ONLY_CP_GROUP, varlen_attention
from megatron.varlen.attention.attention_plan import AttentionPlan, build_attention_plan
from megatron.varlen.attention.flash_attention import (
    FlashVarlenCoreAttention, attend_planned, flash_varlen_attention,
)
from megatron.varlen.attention.varlen_kernel import (
    call_varlen_kernel, emulated_varlen_attn, takes_enable_gqa,
)
from megatron.varlen.packing.cp_split import restore_thd_from_cp_shards, split_thd_for_cp
from megatron.varlen.platform.host_syncs import count_dispatches
from tests.harness.multirank import run_distributed
from tests.unit_tests.varlen.attention._reference import (
    HEAD_DIM, NUM_GROUPS, NUM_HEADS, build, cu, make_config, reference_attention,
)
from tests.unit_tests.varlen.host_reads import CountHostReads

TOLERANCE = 1e-10
# Odd lengths, a length-1 sequence, one sequence padded far beyond its real tokens (whole CP
# chunks of padding), padding multiple 8 = 2 * cp for cp 4.
REAL = [7, 16, 33, 1, 2, 3]
PADDED = [8, 16, 40, 8, 8, 24]
SCALE = 1.0 / math.sqrt(HEAD_DIM)


def _inputs(seed, groups=NUM_GROUPS, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    total = sum(PADDED)
    q = torch.randn(total, NUM_HEADS, HEAD_DIM, generator=gen, dtype=dtype)
    k = torch.randn(total, groups, HEAD_DIM, generator=gen, dtype=dtype)
    v = torch.randn(total, groups, HEAD_DIM, generator=gen, dtype=dtype)
    weight = torch.randn(total, NUM_HEADS, HEAD_DIM, generator=gen, dtype=dtype)
    return q, k, v, weight


def _out_and_grads(fn, q, k, v, weight):
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = fn(q, k, v)
    (out * weight).sum().backward()
    return [out.detach(), q.grad, k.grad, v.grad]


def _reference(q, k, v, causal):
    return varlen_attention(q, k, v, cu(PADDED), cu(REAL), LOCAL_ONLY_CP_GROUP, causal, SCALE)


def emulated_cp(cp, causal, window=None):
    """Every rank's planned kernel call on its shard (with a causal sliding window of
    ``window`` earlier keys, if given); outputs restored to stream order."""
    padded = cu(PADDED)

    def run(q, k, v):
        split = lambda x, r: split_thd_for_cp(x, padded, cp, r, seq_dim=0)
        k_rows = torch.cat([split(k, r) for r in range(cp)])  # the all-gather's rank order
        v_rows = torch.cat([split(v, r) for r in range(cp)])
        shards = [attend_planned(split(q, r), k_rows, v_rows,
                                 build_attention_plan(cu(REAL), padded, cp, r, causal, window),
                                 SCALE, emulated_varlen_attn)
                  for r in range(cp)]
        return restore_thd_from_cp_shards(shards, padded, seq_dim=0)

    return run


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("groups", [NUM_GROUPS, NUM_HEADS], ids=["gqa", "mha"])
@pytest.mark.parametrize("cp", [1, 2, 4])
def test_planned_kernel_equals_reference(cp, groups, causal):
    inputs = _inputs(seed=cp, groups=groups)
    expected = _out_and_grads(lambda q, k, v: _reference(q, k, v, causal), *inputs)
    got = _out_and_grads(emulated_cp(cp, causal), *inputs)
    for name, g, e in zip(["out", "dq", "dk", "dv"], got, expected):
        assert float((g - e).abs().max()) < TOLERANCE, (name, cp, groups, causal)
    assert float(expected[0].abs().sum()) > 0 and float(expected[2].abs().sum()) > 0


def test_padding_rows_are_zero_and_plan_skips_pure_padding_chunks():
    # Sequence 5 (3 real of 24 padded) has whole chunks of padding on every CP-4 rank but 0.
    plan = build_attention_plan(cu(REAL), cu(PADDED), cp_size=4, cp_rank=3)
    assert plan.num_segments < 2 * len(REAL)
    out = emulated_cp(4, True)(*_inputs(seed=3)[:3])
    start = sum(PADDED[:5])
    assert torch.equal(out[start + REAL[5]:], torch.zeros_like(out[start + REAL[5]:]))


def test_emulated_kernel_is_bottom_right_causal_with_gqa():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(3, 4, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(5, 2, 8, generator=gen, dtype=torch.float64)
    v = torch.randn(5, 2, 8, generator=gen, dtype=torch.float64)
    cu_q, cu_k = torch.tensor([0, 3], dtype=torch.int32), torch.tensor([0, 5], dtype=torch.int32)
    out = emulated_varlen_attn(q, k, v, cu_q, cu_k, 3, 5, window_size=(-1, 0), enable_gqa=True)
    # The 3 queries are the LAST 3 of a 5-token causal sequence (bottom-right alignment).
    full_q = torch.cat([torch.zeros(2, 4, 8, dtype=torch.float64), q])
    expected = reference_attention(full_q, k, v, causal=True)[2:]
    assert float((out - expected).abs().max()) < TOLERANCE
    with pytest.raises(ValueError, match="enable_gqa"):
        emulated_varlen_attn(q, k, v, cu_q, cu_k, 3, 5, window_size=(-1, 0))


def test_gqa_keyword_follows_the_kernel_signature():
    seen = []

    def old_kernel(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1)):
        seen.append("no keyword")  # would raise TypeError had it been given enable_gqa
        return q

    def new_kernel(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1),
                   enable_gqa=False):
        seen.append(enable_gqa)
        return q

    q, k = torch.zeros(2, 4, 8), torch.zeros(2, 2, 8)
    cu2 = torch.tensor([0, 2], dtype=torch.int32)
    assert not takes_enable_gqa(old_kernel) and takes_enable_gqa(new_kernel)
    assert takes_enable_gqa(emulated_varlen_attn)
    call_varlen_kernel(old_kernel, q, k, k, cu2, cu2, 2, 2, 1.0, True)  # torch 2.11: no kwarg
    call_varlen_kernel(new_kernel, q, k, k, cu2, cu2, 2, 2, 1.0, True)  # torch 2.12+: True
    assert seen == ["no keyword", True]


def test_older_kernel_signatures_are_adapted_or_refused_in_one_line():
    from megatron.varlen.attention.varlen_kernel import kernel_keywords

    def torch_2_10(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=False, return_aux=None):
        return q

    default = 8 ** -0.5
    assert kernel_keywords(torch_2_10, default, 8, causal=True, bottom_right=False,
                           gqa=False) == {"is_causal": True}
    with pytest.raises(RuntimeError, match="causal context parallelism needs torch >= 2.11"):
        kernel_keywords(torch_2_10, default, 8, causal=True, bottom_right=True, gqa=False)
    with pytest.raises(RuntimeError, match="takes no scale"):
        kernel_keywords(torch_2_10, 0.5, 8, causal=False, bottom_right=False, gqa=False)
    assert kernel_keywords(emulated_varlen_attn, 0.5, 8, causal=True, bottom_right=True,
                           gqa=True) == {"window_size": (-1, 0), "scale": 0.5,
                                         "enable_gqa": True}


def _flash(**kwargs):
    reference = build(**kwargs)
    module = FlashVarlenCoreAttention(reference.config, 1, reference.attn_mask_type,
                                      pg_collection=reference.pg_collection)
    return reference, module


@pytest.mark.parametrize("mask", [AttnMaskType.causal, AttnMaskType.no_mask])
def test_module_thd_and_sbhd_equal_reference_module(mask):
    reference, flash = _flash(attn_mask_type=mask)
    q, k, v, weight = _inputs(seed=11)
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu(REAL), cu_seqlens_kv=cu(REAL),
                             cu_seqlens_q_padded=cu(PADDED), cu_seqlens_kv_padded=cu(PADDED),
                             max_seqlen_q=max(PADDED), max_seqlen_kv=max(PADDED))
    flat = weight.reshape(weight.size(0), -1)
    run = lambda m: (lambda q, k, v: m(q, k, v, None, packed_seq_params=params))
    expected = _out_and_grads(run(reference), q, k, v, flat)
    got = _out_and_grads(run(flash), q, k, v, flat)
    assert max(float((g - e).abs().max()) for g, e in zip(got, expected)) < TOLERANCE
    # sbhd: [s, b, heads, D], each batch row one sequence
    sb = lambda x: x[:48].reshape(12, 4, *x.shape[1:])
    sbhd_weight = sb(weight).reshape(12, 4, -1)
    run_sbhd = lambda m: (lambda q, k, v: m(q, k, v, None))
    expected = _out_and_grads(run_sbhd(reference), sb(q), sb(k), sb(v), sbhd_weight)
    got = _out_and_grads(run_sbhd(flash), sb(q), sb(k), sb(v), sbhd_weight)
    assert max(float((g - e).abs().max()) for g, e in zip(got, expected)) < TOLERANCE


def test_attention_dropout_is_refused_in_one_line():
    with pytest.raises(ValueError, match="--attention-dropout 0.1.*--attention-backend local"):
        FlashVarlenCoreAttention(make_config(attention_dropout=0.1), 1, AttnMaskType.causal,
                                 pg_collection=build().pg_collection)


def _rank_flash_cp_equals_reference():
    """Real all-gather over gloo: the micro-batch brings the CP group (dynamic CP)."""
    group = dist.group.WORLD
    cp, rank = group.size(), group.rank()
    q, k, v, weight = _inputs(seed=21)
    padded = cu(PADDED)
    split = lambda x: split_thd_for_cp(x, padded, cp, rank, seq_dim=0)
    expected = _out_and_grads(lambda q, k, v: _reference(q, k, v, True), q, k, v, weight)
    plan = build_attention_plan(cu(REAL), padded, cp, rank, causal=True)
    got = _out_and_grads(lambda q, k, v: flash_varlen_attention(q, k, v, plan, group, SCALE),
                         split(q), split(k), split(v), split(weight))
    return max(float((g - split(e)).abs().max()) for g, e in zip(got, expected))


def test_flash_cp2_over_gloo_equals_reference_on_the_slice():
    assert max(run_distributed(_rank_flash_cp_equals_reference, 2, timeout_s=120)) < TOLERANCE


# --- no device->host reads in the step: host boundaries, plans built once ---------------------

def _thd_params(with_host_copies=True):
    """The packing layer's params (host copies declared), or megatron-core's plain ones."""
    from megatron.varlen.packing.packed_seq import varlen_packed_seq_params

    if with_host_copies:
        return varlen_packed_seq_params(cu(REAL), cu(PADDED), cu(REAL), cu(PADDED), max(PADDED),
                                        local_cp_size=1)
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu(REAL), cu_seqlens_kv=cu(REAL),
                           cu_seqlens_q_padded=cu(PADDED), cu_seqlens_kv_padded=cu(PADDED),
                           max_seqlen_q=max(PADDED), max_seqlen_kv=max(PADDED))


def test_forward_and_backward_read_nothing_back_from_the_device():
    _, flash = _flash()
    counter = CountHostReads()

    @functools.wraps(emulated_varlen_attn)  # the same signature: the same keywords reach it
    def kernel(*args, **kwargs):
        with counter.exempt():  # the CPU twin reads what the CUDA kernel keeps on the device
            return emulated_varlen_attn(*args, **kwargs)

    flash.kernel = kernel
    params = _thd_params()
    q, k, v, weight = (x.requires_grad_() if i < 3 else x for i, x in enumerate(_inputs(seed=4)))
    flash(q, k, v, None, packed_seq_params=params)  # the micro-batch's first layer builds the plan
    with counter:
        for _layer in range(3):
            out = flash(q, k, v, None, packed_seq_params=params)
            (out * weight.reshape(out.shape)).sum().backward()
    assert counter.reads == [], counter.reads
    # The check itself works: boundaries without host copies are read back.
    params = _thd_params(with_host_copies=False)
    with counter:
        flash(q, k, v, None, packed_seq_params=params)
    assert counter.reads


def test_plan_is_built_once_per_micro_batch_not_per_layer(monkeypatch):
    from megatron.varlen.attention import attention_plan

    built = []
    original = attention_plan.build_attention_plan
    monkeypatch.setattr(attention_plan, "build_attention_plan",
                        lambda *a, **kw: built.append(a) or original(*a, **kw))
    _, flash = _flash()
    q, k, v, _ = _inputs(seed=4)
    for _micro_batch in range(2):
        params = _thd_params()
        for _layer in range(4):
            flash(q, k, v, None, packed_seq_params=params)
    assert len(built) == 2


def test_rope_and_core_attention_see_host_boundaries():
    from megatron.varlen.attention.cp_switching import CPSwitchingSelfAttention

    params = _thd_params()
    layer = type("Layer", (), {"core_attention": build()})()

    def view_of(p):
        arguments = {"packed_seq_params": p}
        CPSwitchingSelfAttention._with_host_boundaries(layer, arguments)
        return arguments["packed_seq_params"]

    view = view_of(params)
    assert view is not params and view.cu_seqlens_q_padded is params.host_cu_seqlens_padded
    assert view.cu_seqlens_q is params.host_cu_seqlens
    assert view.derived is params.derived  # plans shared across layers
    assert view_of(params) is view  # one view per micro-batch and CP group, not one per layer


@pytest.mark.parametrize("value_dim", [4, 8, 12])
def test_padding_only_shard_returns_value_width_zeros_in_the_graph(value_dim):
    """A rank holding only padding (no segment) returns zeros as wide as the values (MLA's
    values may be narrower or wider than its queries/keys), and gradients still reach q."""
    tokens, heads, qk_dim = 3, 2, 8
    plan = AttentionPlan(cp_size=1, cp_rank=0, causal=True, local_tokens=tokens,
                         query_index=None, key_index=None,
                         cu_seq_q=torch.zeros(1, dtype=torch.int32),
                         cu_seq_k=torch.zeros(1, dtype=torch.int32), max_q=0, max_k=0,
                         num_segments=0)
    q = torch.randn(tokens, heads, qk_dim, requires_grad=True)
    k, v = torch.randn(tokens, heads, qk_dim), torch.randn(tokens, heads, value_dim)
    out = attend_planned(q, k, v, plan, scale=1.0, kernel=lambda *a, **kw: None)
    assert out.shape == (tokens, heads, value_dim) and not out.any()
    out.sum().backward()
    assert q.grad is not None and not q.grad.any()


def _causal_float64(q, k, v, scale):
    """Each sequence's real rows attending causally to its own real rows (float64), zeros on
    padding: written per sequence, independently of the plan and the kernel."""
    out = torch.zeros(q.size(0), q.size(1), v.size(-1), dtype=torch.float64)
    start = 0
    for real, padded in zip(REAL, PADDED):
        rows = slice(start, start + real)
        scores = torch.einsum("qhd,khd->hqk", q[rows].double(), k[rows].double()) * scale
        scores = scores.masked_fill(torch.ones(real, real).triu(1).bool(), float("-inf"))
        out[rows] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v[rows].double())
        start += padded
    return out


@pytest.mark.parametrize("value_dim", [4, 8, 12])
def test_values_narrower_or_wider_than_queries_equal_the_float64_attention(value_dim):
    """MLA's widths (values zero-padded to the query width or queries/keys to the value width
    for the kernel, the output cut back to the value width) against a per-sequence float64
    softmax. The kernel's output is cut only where it is wider than the values (narrower
    values were zero-padded): no slice or alias of it otherwise, once per layer."""
    gen = torch.Generator().manual_seed(value_dim)
    tokens, heads, qk_dim = sum(PADDED), 2, 8
    q, k = (torch.randn(tokens, heads, qk_dim, generator=gen, dtype=torch.float64)
            for _ in range(2))
    v = torch.randn(tokens, heads, value_dim, generator=gen, dtype=torch.float64)
    plan = build_attention_plan(cu(REAL), cu(PADDED), cp_size=1, cp_rank=0)
    with count_dispatches() as counts:
        out = attend_planned(q, k, v, plan, scale=0.5, kernel=emulated_varlen_attn)
    assert out.shape == (tokens, heads, value_dim)
    torch.testing.assert_close(out, _causal_float64(q, k, v, 0.5), rtol=0, atol=TOLERANCE)
    cuts = {op for (op, site), n in counts.items()
            if site.startswith("megatron/varlen/attention/flash_attention.py")
            and op in ("slice", "alias")}
    assert (cuts != set()) == (value_dim < qk_dim), cuts
