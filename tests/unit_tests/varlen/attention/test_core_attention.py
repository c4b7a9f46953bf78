"""VarlenCoreAttention on one process against an independent float64 reference.

Shape legend: T = packed padded tokens, N = query heads, G = kv groups, D = head dim.
"""

import pytest
import torch
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.enums import AttnMaskType

from tests.unit_tests.varlen.attention._reference import (
    ATOL,
    HEAD_DIM,
    NUM_GROUPS,
    NUM_HEADS,
    REAL_LENGTHS,
    build,
    cu,
    make_config,
    packed_inputs,
    reference_attention,
    reference_packed,
)


@pytest.mark.parametrize("causal", [True, False])
def test_thd_matches_per_sequence_reference(causal):
    q, k, v, params, padded = packed_inputs()
    mask = AttnMaskType.causal if causal else AttnMaskType.no_mask
    out = build()(q, k, v, None, attn_mask_type=mask, packed_seq_params=params)
    assert out.shape == (q.size(0), NUM_HEADS * HEAD_DIM)
    expected = reference_packed(q, k, v, padded, causal).reshape(out.shape)
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=0)


def test_thd_with_batch_dim_and_without_padded_boundaries():
    q, k, v, params, padded = packed_inputs(pad_multiple=1)  # unpadded stream
    params.cu_seqlens_q_padded = params.cu_seqlens_kv_padded = None
    out = build()(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), None, packed_seq_params=params)
    assert out.shape == (q.size(0), 1, NUM_HEADS * HEAD_DIM)
    expected = reference_packed(q, k, v, padded).reshape(out.shape)
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=0)


def test_padding_rows_are_zero_and_nan_free_even_fully_padded():
    q, k, v, params, padded = packed_inputs(pad_multiple=8)  # sequence "1" is 1 real + 7 pad
    out = build()(q, k, v, None, packed_seq_params=params)
    assert torch.isfinite(out).all()
    real_rows = torch.cat([torch.arange(s, s + r) for s, r in
                           zip(cu(padded)[:-1].tolist(), REAL_LENGTHS)])
    pad_rows = torch.ones(q.size(0), dtype=torch.bool)
    pad_rows[real_rows] = False
    assert out[pad_rows].abs().max() == 0


def test_sbhd_gqa_matches_reference():
    s, b = 12, 3
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(s, b, NUM_HEADS, HEAD_DIM, generator=gen, dtype=torch.float64)
    k = torch.randn(s, b, NUM_GROUPS, HEAD_DIM, generator=gen, dtype=torch.float64)
    v = torch.randn(s, b, NUM_GROUPS, HEAD_DIM, generator=gen, dtype=torch.float64)
    out = build()(q, k, v, None)
    assert out.shape == (s, b, NUM_HEADS * HEAD_DIM)
    for i in range(b):
        expected = reference_attention(q[:, i], k[:, i], v[:, i]).reshape(s, -1)
        torch.testing.assert_close(out[:, i], expected, atol=ATOL, rtol=0)


def test_softmax_scale_is_respected():
    q, k, v, params, _ = packed_inputs()
    out = build(softmax_scale=0.3)(q, k, v, None, packed_seq_params=params)
    start, real = 0, REAL_LENGTHS[0]
    expected = reference_attention(q[:real], k[:real], v[:real], scale=0.3).reshape(real, -1)
    torch.testing.assert_close(out[start:real], expected, atol=ATOL, rtol=0)


def test_gradients_match_reference():
    q, k, v, params, padded = packed_inputs(seed=3)
    weight = torch.randn(q.size(0), NUM_HEADS * HEAD_DIM, dtype=torch.float64)
    grads = []
    for fn in (lambda a, b, c: build()(a, b, c, None, packed_seq_params=params),
               lambda a, b, c: reference_packed(a, b, c, padded).reshape(a.size(0), -1)):
        inputs = [x.clone().requires_grad_() for x in (q, k, v)]
        (fn(*inputs) * weight).sum().backward()
        grads.append([x.grad for x in inputs])
    for got, expected in zip(*grads):
        torch.testing.assert_close(got, expected, atol=1e-9, rtol=0)


def test_gradcheck_small_pack():
    module = build()
    cu_real, cu_pad = cu([3, 1]), cu([4, 2])
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu_real, cu_seqlens_kv=cu_real,
                             cu_seqlens_q_padded=cu_pad, cu_seqlens_kv_padded=cu_pad)
    gen = torch.Generator().manual_seed(4)
    # the module reads head counts from the tensors: keep the Jacobian small (2 heads, 1 group)
    inputs = [torch.randn(6, h, 2, generator=gen, dtype=torch.float64, requires_grad=True)
              for h in (2, 1, 1)]
    assert torch.autograd.gradcheck(
        lambda a, b, c: module(a, b, c, None, packed_seq_params=params), inputs, fast_mode=True)


def test_user_errors_raise_value_error():
    q, k, v, params, _ = packed_inputs()
    module = build()
    with pytest.raises(ValueError, match="attention_bias"):
        module(q, k, v, None, attention_bias=torch.zeros(1), packed_seq_params=params)
    with pytest.raises(ValueError, match="whole pack"):
        module(q[:-4], k[:-4], v[:-4], None, packed_seq_params=params)
    with pytest.raises(ValueError, match="attn_mask_type"):
        module(q, k, v, None, attn_mask_type=AttnMaskType.arbitrary, packed_seq_params=params)
    with pytest.raises(ValueError, match="window_size right 2 must be 0"):
        build(make_config(window_size=(4, 2)))


def test_dropout_uses_the_tensor_parallel_rng_fork(monkeypatch):
    from megatron.core.tensor_parallel import random as mcore_random

    forks = []

    class _Tracker:
        def fork(self):
            forks.append(1)
            return torch.random.fork_rng(devices=[])  # the CPU generator only, whatever device_count says

    monkeypatch.setattr(mcore_random, "get_cuda_rng_tracker", lambda *a, **k: _Tracker())
    q, k, v, params, _ = packed_inputs()
    module = build(make_config(attention_dropout=0.5))
    module.train()
    module(q, k, v, None, packed_seq_params=params)
    assert len(forks) == len(REAL_LENGTHS)
    module.eval()
    module(q, k, v, None, packed_seq_params=params)
    assert len(forks) == len(REAL_LENGTHS)
