"""An independent float64 re-computation of one multi-latent attention layer from its own
weights (DeepSeek-V2/V3 MLA, as the papers and megatron-core's config fields define it), for
tests/unit_tests/varlen_training/test_mla.py.

Shape legend: T = packed tokens, s = one sequence's tokens, n = heads, h = hidden size,
c = kv latent rank, r = rotated channels per head (qk_pos_emb_head_dim), d = plain q/k channels
per head (qk_head_dim), e = value channels per head (v_head_dim).
"""

import math

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    if weight is None:  # no latent norm in the layer
        return x
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def yarn_get_mscale(factor: float, mscale: float) -> float:
    """YaRN's attention temperature: 0.1 * mscale * ln(factor) + 1 (1 when not stretched)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_inverse_frequencies(dim: int, base: float, factor: float, original_max: int,
                             beta_fast: float, beta_slow: float) -> torch.Tensor:
    """YaRN (Peng et al. 2023, DeepSeek-V2's form): frequency index i keeps base^(-2i/dim) below
    the correction range, is divided by ``factor`` above it, and blends linearly inside; the
    range bounds are the indices whose wavelength turns beta_fast / beta_slow times in the
    original context (floor / ceil, clamped to [0, dim - 1])."""
    def index_of(turns: float) -> float:
        return dim * math.log(original_max / (turns * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(index_of(beta_fast)), 0)
    high = min(math.ceil(index_of(beta_slow)), dim - 1)
    high = high + 0.001 if high == low else high
    index = torch.arange(dim // 2, dtype=torch.float64)
    blend = ((index - low) / (high - low)).clamp(0, 1)  # 0: original, 1: interpolated
    original = base ** (-2 * index / dim)
    return original * (1 - blend) + original / factor * blend


def rope_inverse_frequencies(dim: int, base: float) -> torch.Tensor:
    return base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def rotate(x_snr: torch.Tensor, inv_freq: torch.Tensor, scale: float) -> torch.Tensor:
    """DeepSeek-V2's RoPE of the rotated channels at positions 0..s-1: channels 2j and 2j+1
    form pair j (frequency ``inv_freq[j]``), laid out as [even channels, odd channels] before
    the rotation of halves (the output keeps that layout); cos/sin times ``scale`` (YaRN's
    mscale)."""
    x_snr = torch.cat([x_snr[..., 0::2], x_snr[..., 1::2]], -1)
    angles = torch.outer(torch.arange(x_snr.size(0), dtype=torch.float64), inv_freq)
    cos = (torch.cat([angles, angles], -1).cos() * scale)[:, None, :]
    sin = (torch.cat([angles, angles], -1).sin() * scale)[:, None, :]
    first, second = x_snr.chunk(2, dim=-1)
    return x_snr * cos + torch.cat([-second, first], -1) * sin


def mla_layer_reference(hidden_Th: torch.Tensor, weights: dict, shape: dict,
                        real_lengths: list[int], padded_lengths: list[int]) -> torch.Tensor:
    """The layer's output on every real token of the pack, [sum(real_lengths), h], float64.

    ``weights``: ``q`` ([n(d+r), h]) or ``q_down`` ([q_rank, h]), ``q_up``, ``q_norm``;
    ``kv_down`` ([c + r, h]), ``kv_norm``, ``kv_up`` ([n(d+e), c]), ``proj`` ([h, n e]).
    ``shape``: heads, qk_head_dim, qk_pos_emb_head_dim, v_head_dim, kv_lora_rank, eps,
    inv_freq (the rotated channels' frequencies), rope_scale (cos/sin factor), softmax_scale.
    """
    w = {name: t.double() if t is not None else None for name, t in weights.items()}
    x = hidden_Th.double()
    n, d, r, e = (shape[k] for k in ("heads", "qk_head_dim", "qk_pos_emb_head_dim",
                                      "v_head_dim"))
    if "q" in w:
        q = x @ w["q"].T
    else:
        q = rms_norm(x @ w["q_down"].T, w["q_norm"], shape["eps"]) @ w["q_up"].T
    q = q.view(-1, n, d + r)
    latent = x @ w["kv_down"].T
    c = shape["kv_lora_rank"]
    kv = rms_norm(latent[:, :c], w["kv_norm"], shape["eps"]) @ w["kv_up"].T
    kv = kv.view(-1, n, d + e)
    k_rope = latent[:, None, c:]  # one rotated key per token, shared by every head
    outputs, start = [], 0
    for real, padded in zip(real_lengths, padded_lengths):
        rows = slice(start, start + real)
        q_seq = torch.cat([q[rows, :, :d], rotate(q[rows, :, d:], shape["inv_freq"],
                                                  shape["rope_scale"])], -1)
        k_pe = rotate(k_rope[rows], shape["inv_freq"], shape["rope_scale"]).expand(-1, n, -1)
        k_seq = torch.cat([kv[rows, :, :d], k_pe], -1)
        scores = torch.einsum("qnd,knd->nqk", q_seq, k_seq) * shape["softmax_scale"]
        future = torch.ones(real, real, dtype=torch.bool).triu(1)
        probs = scores.masked_fill(future, float("-inf")).softmax(-1)
        outputs.append(torch.einsum("nqk,kne->qne", probs, kv[rows, :, d:]).reshape(real, -1))
        start += padded
    return torch.cat(outputs) @ w["proj"].T
