"""The plain-torch Mamba kernel twins against a float64 step-by-step recurrence.

The reference below walks tokens one at a time and resets the SSM state and the convolution
window at every packed-sequence start; it shares no code with the chunked twins.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from megatron.varlen.mamba.causal_conv import causal_conv1d_fn
from megatron.varlen.mamba.kernels import TORCH_KERNELS, select_kernels
from megatron.varlen.mamba.split_conv_scan import mamba_split_conv1d_scan_combined
from megatron.varlen.mamba.ssd_scan import mamba_chunk_scan_combined

TOL = dict(rtol=1e-10, atol=1e-10)


def _starts(seq_idx_row, t):
    return t == 0 or int(seq_idx_row[t]) != int(seq_idx_row[t - 1])


def reference_scan(x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                   dt_limit=(0.0, math.inf), seq_idx=None):
    """float64 recurrence, one token at a time: S = exp(dt A) S + dt x B^T; y = S C + D x."""
    x, dt, A, B, C = (t.double() for t in (x, dt, A, B, C))
    b, length, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    y = torch.zeros_like(x)
    for bi in range(b):
        state = torch.zeros(h, p, n, dtype=torch.float64)
        for t in range(length):
            if seq_idx is not None and _starts(seq_idx[bi], t):
                state = torch.zeros_like(state)
            for hi in range(h):
                step = dt[bi, t, hi] + (0 if dt_bias is None else dt_bias[hi].double())
                if dt_softplus:
                    step = torch.log1p(torch.exp(step)) if step <= 20 else step
                if tuple(dt_limit) != (0.0, math.inf):  # the default means no clamp
                    step = min(max(step, dt_limit[0]), dt_limit[1])
                gi = hi // (h // g)
                state[hi] = torch.exp(step * A[hi]) * state[hi] + step * torch.outer(
                    x[bi, t, hi], B[bi, t, gi])
                y[bi, t, hi] = state[hi] @ C[bi, t, gi]
    if D is not None:
        D = D.double()
        y = y + x * (D.view(1, 1, h, 1) if D.dim() == 1 else D.view(1, 1, h, p))
    if z is not None:
        zz = z.double()
        y = y * zz * torch.sigmoid(zz)
    return y


def reference_conv(x, weight, bias, seq_idx=None, silu=True):
    """float64 causal depthwise convolution with the window cut at each sequence start."""
    x, weight = x.double(), weight.double()
    b, d, length = x.shape
    width = weight.shape[1]
    out = torch.zeros_like(x)
    for bi in range(b):
        for t in range(length):
            first = t
            while first > 0 and (seq_idx is None or not _starts(seq_idx[bi], first)):
                first -= 1  # walk back to this token's sequence start
            acc = torch.zeros(d, dtype=torch.float64) if bias is None else bias.double().clone()
            for k in range(width):
                src = t - (width - 1) + k
                if src >= max(first, 0):
                    acc = acc + weight[:, k] * x[bi, :, src]
            out[bi, :, t] = acc
    return out * torch.sigmoid(out) if silu else out


def _inputs(b=2, length=11, h=4, p=3, g=2, n=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    return dict(x=r(b, length, h, p),
                dt=torch.rand(b, length, h, generator=gen, dtype=torch.float64),
                A=-torch.rand(h, generator=gen, dtype=torch.float64) * 2 - 0.1,
                B=r(b, length, g, n), C=r(b, length, g, n))


def _seq_idx(lengths, b=1):
    row = torch.cat([torch.full((n,), i, dtype=torch.int32) for i, n in enumerate(lengths)])
    return row.unsqueeze(0).expand(b, -1).contiguous()


@pytest.mark.parametrize("chunk_size", [1, 3, 4, 16])
def test_scan_matches_recurrence_without_packing(chunk_size):
    inp = _inputs()
    got = mamba_chunk_scan_combined(**inp, chunk_size=chunk_size)
    torch.testing.assert_close(got, reference_scan(**inp), **TOL)


@pytest.mark.parametrize("lengths", [[1, 4, 1, 5], [3, 8], [11], [1] * 11, [2, 7, 2]])
@pytest.mark.parametrize("chunk_size", [2, 4, 5])
def test_scan_honours_seq_idx(lengths, chunk_size):
    """Boundaries inside chunks, on chunk edges, length-1 and odd-length sequences."""
    inp = _inputs(length=sum(lengths))
    seq_idx = _seq_idx(lengths, b=2)
    extras = dict(D=torch.randn(4, dtype=torch.float64), dt_bias=torch.randn(4).double(),
                  z=torch.randn(2, sum(lengths), 4, 3, dtype=torch.float64), dt_softplus=True)
    got = mamba_chunk_scan_combined(**inp, chunk_size=chunk_size, seq_idx=seq_idx, **extras)
    torch.testing.assert_close(got, reference_scan(**inp, seq_idx=seq_idx, **extras), **TOL)


def test_packed_sequence_equals_its_own_run():
    """Packing a sequence beside others does not change its outputs (scan level)."""
    lengths = [3, 6, 1, 5]
    inp = _inputs(b=1, length=sum(lengths))
    packed = mamba_chunk_scan_combined(**inp, chunk_size=4, seq_idx=_seq_idx(lengths))
    start = 0
    for n in lengths:
        alone = {k: (v[:, start:start + n] if v.dim() > 1 else v) for k, v in inp.items()}
        torch.testing.assert_close(packed[:, start:start + n],
                                   mamba_chunk_scan_combined(**alone, chunk_size=4), **TOL)
        start += n


def test_scan_dt_limit_and_hdim_D():
    inp = _inputs(length=7)
    D = torch.randn(4, 3, dtype=torch.float64)
    kwargs = dict(D=D, dt_softplus=True, dt_limit=(0.2, 0.9))
    torch.testing.assert_close(mamba_chunk_scan_combined(**inp, chunk_size=3, **kwargs),
                               reference_scan(**inp, **kwargs), **TOL)


def test_scan_float32_keeps_dtype_and_is_close():
    inp = _inputs(length=9)
    got = mamba_chunk_scan_combined(**{k: v.float() for k, v in inp.items()}, chunk_size=4)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), reference_scan(**inp), rtol=1e-5, atol=1e-5)


def test_scan_gradients_match_finite_differences():
    inp = _inputs(b=1, length=6, h=2, p=2, g=1, n=2)
    seq_idx = _seq_idx([2, 1, 3])
    names = ["x", "dt", "A", "B", "C"]
    leaves = [inp[k].clone().requires_grad_() for k in names]

    def f(*tensors):
        return mamba_chunk_scan_combined(*tensors, chunk_size=4, seq_idx=seq_idx,
                                         dt_softplus=True)
    assert torch.autograd.gradcheck(f, leaves)


@pytest.mark.parametrize("lengths", [[11], [1, 4, 6], [2, 1, 1, 7]])
def test_conv_matches_reference(lengths):
    gen = torch.Generator().manual_seed(1)
    length = sum(lengths)
    x = torch.randn(2, 6, length, generator=gen, dtype=torch.float64)
    weight = torch.randn(6, 4, generator=gen, dtype=torch.float64)
    bias = torch.randn(6, generator=gen, dtype=torch.float64)
    seq_idx = _seq_idx(lengths, b=2)
    got = causal_conv1d_fn(x, weight, bias, seq_idx=seq_idx, activation="silu")
    torch.testing.assert_close(got, reference_conv(x, weight, bias, seq_idx), **TOL)
    plain = causal_conv1d_fn(x, weight, None, activation=None)
    torch.testing.assert_close(plain, reference_conv(x, weight, None, None, silu=False), **TOL)


def test_conv_matches_torch_conv1d_without_packing():
    """Independent check of the tap order: torch's Conv1d with left padding w-1."""
    x = torch.randn(1, 5, 9, dtype=torch.float64)
    conv = torch.nn.Conv1d(5, 5, 4, groups=5, padding=3, dtype=torch.float64)
    expected = F.silu(conv(x)[..., :9])
    got = causal_conv1d_fn(x, conv.weight.squeeze(1), conv.bias, activation="silu")
    torch.testing.assert_close(got, expected, **TOL)


def test_conv_gradients_match_finite_differences():
    x = torch.randn(1, 3, 7, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, requires_grad=True)
    seq_idx = _seq_idx([3, 1, 3])
    assert torch.autograd.gradcheck(
        lambda *t: causal_conv1d_fn(*t, seq_idx=seq_idx, activation="silu"), (x, w, b))


def test_split_conv_scan_composes_conv_and_scan():
    """The fused training entry point == conv (reference) then scan (reference), gated."""
    gen = torch.Generator().manual_seed(2)
    h, p, g, n, width, length = 4, 2, 2, 3, 4, 9
    dim = h * p
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    zxbcdt = r(1, length, 2 * dim + 2 * g * n + h)
    weight, bias = r(dim + 2 * g * n, width), r(dim + 2 * g * n)
    dt_bias, A, D = r(h), -torch.rand(h, generator=gen, dtype=torch.float64) - 0.1, r(h)
    seq_idx = _seq_idx([4, 1, 4])
    got = mamba_split_conv1d_scan_combined(zxbcdt, weight, bias, dt_bias, A, D, chunk_size=4,
                                           seq_idx=seq_idx, headdim=p, ngroups=g)
    z, xBC, dt = torch.split(zxbcdt, [dim, dim + 2 * g * n, h], dim=-1)
    xBC = reference_conv(xBC.transpose(1, 2), weight, bias, seq_idx).transpose(1, 2)
    x, B, C = torch.split(xBC, [dim, g * n, g * n], dim=-1)
    expected = reference_scan(x.reshape(1, length, h, p), dt, A, B.reshape(1, length, g, n),
                              C.reshape(1, length, g, n), D=D, z=z.reshape(1, length, h, p),
                              dt_bias=dt_bias, dt_softplus=True, seq_idx=seq_idx)
    torch.testing.assert_close(got, expected.reshape(1, length, dim), **TOL)


def test_inference_options_are_refused():
    inp = _inputs(length=3)
    with pytest.raises(NotImplementedError, match="training call only"):
        mamba_chunk_scan_combined(**inp, chunk_size=2, return_final_states=True)


def test_cpu_selects_the_twins():
    assert select_kernels().source == TORCH_KERNELS
    assert select_kernels(TORCH_KERNELS).mamba_chunk_scan_combined is mamba_chunk_scan_combined


def _fake_kernel_modules(monkeypatch):
    """Stand-ins for causal_conv1d and mamba_ssm's ssd_combined (absent on this machine)."""
    import sys
    import types

    fakes = {}
    for name in ("causal_conv1d", "mamba_ssm", "mamba_ssm.ops", "mamba_ssm.ops.triton",
                 "mamba_ssm.ops.triton.ssd_combined"):
        fakes[name] = types.ModuleType(name)
        monkeypatch.setitem(sys.modules, name, fakes[name])
    fakes["causal_conv1d"].causal_conv1d_fn = lambda *a, **k: "conv"
    ssd = fakes["mamba_ssm.ops.triton.ssd_combined"]
    ssd.mamba_chunk_scan_combined = lambda *a, **k: "scan"
    ssd.mamba_split_conv1d_scan_combined = lambda *a, **k: "split"
    return fakes


def test_adapter_uses_real_kernels_when_they_import(monkeypatch):
    from megatron.varlen.mamba import kernels

    select_kernels.cache_clear()
    with pytest.raises(ImportError):
        kernels.cuda_kernels()  # not installed here
    fakes = _fake_kernel_modules(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    try:
        chosen = select_kernels()
        assert chosen.source == kernels.CUDA_KERNELS
        assert chosen.causal_conv1d_fn is fakes["causal_conv1d"].causal_conv1d_fn
        select_kernels.cache_clear()
        monkeypatch.setenv(kernels.KERNELS_ENV, TORCH_KERNELS)  # the override wins
        assert select_kernels().source == TORCH_KERNELS
        with pytest.raises(ValueError, match="expected"):
            select_kernels("triton")
    finally:
        select_kernels.cache_clear()
