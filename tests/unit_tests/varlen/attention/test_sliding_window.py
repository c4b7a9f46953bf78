"""Sliding-window attention (``--window-size W,0``) on every attention path here, against an
independent float64 reference.

The reference knows nothing of packing, padding, plans or CP: per sequence, on its real tokens
only, query i sees keys max(0, i - W) .. i (megatron-core's window ``(W, 0)``; Hugging Face's
``sliding_window`` W + 1), one dense softmax. Checked against it: the local attention
(VarlenCoreAttention, THD and SBHD), the flash backend's planned kernel call on CP 1, 2, 4
(every rank's shard, emulated on one process) and over gloo, outputs and gradients. Plus the
layer choice (``--window-attn-skip-freq``) and the kernel's keywords.
Shape legend: T = packed padded tokens, N = query heads, G = kv groups, D = head dim.
"""

import pytest
import torch
import torch.distributed as dist
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.enums import AttnMaskType

from megatron.varlen.attention import LOCAL_ONLY_CP_GROUP, VarlenCoreAttention, varlen_attention
from megatron.varlen.attention.attention_plan import build_attention_plan
from megatron.varlen.attention.flash_attention import (
    FlashVarlenCoreAttention, flash_varlen_attention,
)
from megatron.varlen.attention.sliding_window import layer_window, windowed_layers
from megatron.varlen.attention.varlen_kernel import emulated_varlen_attn, kernel_keywords
from megatron.varlen.packing.cp_split import split_thd_for_cp
from tests.harness.multirank import run_distributed
from tests.unit_tests.varlen.attention._reference import (
    HEAD_DIM, NUM_GROUPS, NUM_HEADS, build, cu, make_config,
)
# The flash tests' pack (odd lengths, a length-1 sequence, one padded by whole CP-4 chunks) and
# their CP emulation: every rank's plan on its shard, K/V in the all-gather's rank order.
from tests.unit_tests.varlen.attention.test_flash_attention import (
    PADDED, REAL, SCALE, emulated_cp,
)

TOLERANCE = 1e-10
# 0: only itself; 1, 3, 5: narrower than most sequences, crossing CP chunk edges; 40: wider
# than every sequence (the same as no window).
WINDOWS = [0, 1, 3, 5, 40]


def _inputs(seed):
    gen = torch.Generator().manual_seed(seed)
    total = sum(PADDED)
    q = torch.randn(total, NUM_HEADS, HEAD_DIM, generator=gen, dtype=torch.float64)
    k = torch.randn(total, NUM_GROUPS, HEAD_DIM, generator=gen, dtype=torch.float64)
    v = torch.randn(total, NUM_GROUPS, HEAD_DIM, generator=gen, dtype=torch.float64)
    weight = torch.randn(total, NUM_HEADS, HEAD_DIM, generator=gen, dtype=torch.float64)
    return q, k, v, weight


def _windowed_reference(q, k, v, window):
    """Per sequence, real tokens only: query i over keys max(0, i - window) .. i, float64;
    padding rows zero."""
    out = torch.zeros(q.size(0), NUM_HEADS, HEAD_DIM, dtype=torch.float64)
    start = 0
    for real, pad in zip(REAL, PADDED):
        rows = slice(start, start + real)
        qs = q[rows]
        ks, vs = (x[rows].repeat_interleave(NUM_HEADS // NUM_GROUPS, 1) for x in (k, v))
        scores = torch.einsum("qnd,knd->nqk", qs, ks) * SCALE
        i = torch.arange(real)[:, None]
        j = torch.arange(real)[None, :]
        allowed = (j <= i) & (j >= i - window)
        scores = scores.masked_fill(~allowed, float("-inf"))
        out[rows] = torch.einsum("nqk,knd->qnd", scores.softmax(-1), vs)
        start += pad
    return out


def _out_and_grads(fn, q, k, v, weight):
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = fn(q, k, v)
    (out * weight).sum().backward()
    return [out.detach(), q.grad, k.grad, v.grad]


def _assert_close(got, expected, what):
    for name, g, e in zip(["out", "dq", "dk", "dv"], got, expected):
        assert float((g - e).abs().max()) < TOLERANCE, (name, what)


@pytest.mark.parametrize("window", WINDOWS)
def test_local_attention_equals_the_windowed_reference(window):
    inputs = _inputs(seed=window)
    expected = _out_and_grads(lambda q, k, v: _windowed_reference(q, k, v, window), *inputs)
    got = _out_and_grads(
        lambda q, k, v: varlen_attention(q, k, v, cu(PADDED), cu(REAL), LOCAL_ONLY_CP_GROUP,
                                         True, SCALE, window_left=window), *inputs)
    _assert_close(got, expected, window)


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("cp", [1, 2, 4])
def test_planned_kernel_equals_the_windowed_reference(cp, window):
    inputs = _inputs(seed=10 * cp + window)
    expected = _out_and_grads(lambda q, k, v: _windowed_reference(q, k, v, window), *inputs)
    _assert_close(_out_and_grads(emulated_cp(cp, True, window), *inputs), expected, (cp, window))


def test_a_narrow_window_changes_the_output_and_a_wide_one_does_not():
    q, k, v, _ = _inputs(seed=1)
    plain = varlen_attention(q, k, v, cu(PADDED), cu(REAL), LOCAL_ONLY_CP_GROUP, True, SCALE)
    wide = _windowed_reference(q, k, v, max(REAL))
    narrow = _windowed_reference(q, k, v, 3)
    assert float((plain - wide).abs().max()) < TOLERANCE
    assert float((plain - narrow).abs().max()) > 0.1


def test_the_plan_reads_only_the_window_of_keys():
    # CP 2, rank 1 holds chunks 1 and 2 of sequence 2 (40 padded: chunks of 10): a query chunk
    # starting at 20 with a 3-key window needs keys 17.. only.
    full = build_attention_plan(cu(REAL), cu(PADDED), 2, 1, True)
    windowed = build_attention_plan(cu(REAL), cu(PADDED), 2, 1, True, 3)
    assert windowed.max_k < full.max_k
    assert windowed.key_index.numel() < full.key_index.numel()
    assert windowed.max_k <= windowed.max_q + 3
    with pytest.raises(ValueError, match="needs causal"):
        build_attention_plan(cu(REAL), cu(PADDED), 2, 1, False, 3)


def _params():
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu(REAL), cu_seqlens_kv=cu(REAL),
                           cu_seqlens_q_padded=cu(PADDED), cu_seqlens_kv_padded=cu(PADDED),
                           max_seqlen_q=max(PADDED), max_seqlen_kv=max(PADDED))


@pytest.mark.parametrize("backend", [build, "flash"])
def test_modules_window_thd_and_sbhd_as_the_reference(backend):
    config = make_config(window_size=(3, 0))
    local = build(config)
    module = local if backend is build else FlashVarlenCoreAttention(
        config, 1, AttnMaskType.causal, pg_collection=local.pg_collection)
    q, k, v, weight = _inputs(seed=7)
    flat = lambda x: x.reshape(x.size(0), -1)
    expected = _out_and_grads(lambda q, k, v: flat(_windowed_reference(q, k, v, 3)),
                              q, k, v, flat(weight))
    got = _out_and_grads(lambda q, k, v: module(q, k, v, None, packed_seq_params=_params()),
                         q, k, v, flat(weight))
    _assert_close(got, expected, "thd")
    # sbhd [s, b, heads, D]: batch row b holds tokens 16b .. 16b + 15 of one 16-token sequence
    s, b = 16, 3
    sb = lambda x: x[:s * b].reshape(b, s, *x.shape[1:]).transpose(0, 1)
    out = module(sb(q), sb(k), sb(v), None)
    for row in range(b):
        rows = slice(row * s, (row + 1) * s)
        qs, ks, vs = (x[rows] for x in (q, k, v))
        ref = _one_sequence_reference(qs, ks, vs, 3)
        assert float((out[:, row].reshape(s, NUM_HEADS, HEAD_DIM) - ref).abs().max()) < TOLERANCE


def _one_sequence_reference(q, k, v, window):
    ks, vs = (x.repeat_interleave(NUM_HEADS // NUM_GROUPS, 1) for x in (k, v))
    scores = torch.einsum("qnd,knd->nqk", q, ks) * SCALE
    i, j = torch.arange(q.size(0))[:, None], torch.arange(q.size(0))[None, :]
    scores = scores.masked_fill(~((j <= i) & (j >= i - window)), float("-inf"))
    return torch.einsum("nqk,knd->qnd", scores.softmax(-1), vs)


def test_layer_choice_follows_window_attn_skip_freq():
    # megatron-core's meaning: an int N leaves every N-th layer (1-based) on full attention,
    # a list marks windowed layers with 1; (-1, 0) is no window at all.
    assert windowed_layers((4, 0), None, 4) == [True] * 4
    assert windowed_layers((4, 0), 2, 4) == [True, False, True, False]
    assert windowed_layers((4, 0), [0, 1, 1, 0], 4) == [False, True, True, False]
    assert windowed_layers(None, 2, 4) == [False] * 4
    assert windowed_layers((-1, 0), None, 2) == [False, False]
    assert layer_window((4, 0), 3, 3) is None and layer_window((4, 0), 3, 2) == 4
    config = make_config(num_layers=2, window_size=(4, 0), window_attn_skip_freq=2)
    first, second = (VarlenCoreAttention(config, n, AttnMaskType.causal,
                                         pg_collection=build().pg_collection) for n in (1, 2))
    assert (first.window_left, second.window_left) == (4, None)


def test_unusable_windows_are_refused_in_one_line():
    with pytest.raises(ValueError, match="window_size right 1 must be 0"):
        build(make_config(window_size=(4, 1)))
    with pytest.raises(ValueError, match="window_size left -2"):
        build(make_config(window_size=(-2, 0)))
    module = build(make_config(window_size=(2, 0)))
    q, k, v, _ = _inputs(seed=0)
    with pytest.raises(ValueError, match="needs causal"):
        module(q, k, v, None, attn_mask_type=AttnMaskType.no_mask, packed_seq_params=_params())


def test_kernel_gets_the_bottom_right_window_or_refuses_in_one_line():
    keywords = kernel_keywords(emulated_varlen_attn, SCALE, HEAD_DIM, causal=True,
                               bottom_right=True, gqa=False, window_left=5)
    assert keywords["window_size"] == (5, 0)

    def torch_2_10(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, is_causal=False):
        return query

    with pytest.raises(RuntimeError, match="--window-size needs torch >= 2.11"):
        kernel_keywords(torch_2_10, SCALE, HEAD_DIM, causal=True, bottom_right=False,
                        gqa=False, window_left=5)


def _rank_windowed_cp_equals_reference():
    """Real all-gather over gloo for both backends, a 5-key window."""
    group = dist.group.WORLD
    cp, rank = group.size(), group.rank()
    q, k, v, weight = _inputs(seed=21)
    padded = cu(PADDED)
    split = lambda x: split_thd_for_cp(x, padded, cp, rank, seq_dim=0)
    expected = _out_and_grads(lambda q, k, v: _windowed_reference(q, k, v, 5), q, k, v, weight)
    plan = build_attention_plan(cu(REAL), padded, cp, rank, True, 5)
    flash = _out_and_grads(lambda q, k, v: flash_varlen_attention(q, k, v, plan, group, SCALE),
                           split(q), split(k), split(v), split(weight))
    local = _out_and_grads(
        lambda q, k, v: varlen_attention(q, k, v, padded, cu(REAL), group, True, SCALE,
                                         window_left=5),
        split(q), split(k), split(v), split(weight))
    return max(float((g - split(e)).abs().max())
               for got in (flash, local) for g, e in zip(got, expected))


def test_windowed_cp2_over_gloo_equals_the_reference_on_the_slice():
    assert max(run_distributed(_rank_windowed_cp_equals_reference, 2, timeout_s=120)) \
        < TOLERANCE
