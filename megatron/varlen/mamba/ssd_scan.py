"""Plain-torch twin of mamba_ssm's ``mamba_chunk_scan_combined`` (the Mamba-2 SSD scan).

Per head ``h`` the selective state space recurrence over a sequence is

    dt_t  = clamp(softplus(dt_t + dt_bias_h), *dt_limit)          (softplus if dt_softplus)
    S_t   = exp(dt_t * A_h) * S_{t-1} + dt_t * x_t B_t^T           (S: [headdim, d_state])
    y_t   = S_t C_t + D_h * x_t
    y_t  *= silu(z_t)                                              (if z is given)

computed here in chunks of ``chunk_size`` tokens as the Mamba-2 "state space duality" form:
inside a chunk the recurrence is a masked (lower-triangular, decay-weighted) attention-like
product; between chunks a state is carried with one multiply per chunk. ``seq_idx`` marks
packed sequences: a token only sees earlier tokens with the same ``seq_idx`` (no state crosses a
packed-sequence boundary), exactly as the CUDA kernel honours it.

Decays are built from SEGMENT sums (masked cumulative sums of ``dt * A``), never from a
difference of two cumulative sums: a boundary is an ``exp(-inf) = 0`` factor and a difference
of cumulative sums would meet ``-inf - -inf``. Everything is differentiable by autograd; the
computation runs in float32 (float64 stays float64) and the result has ``x``'s dtype, like the
kernel.

Shape legend: b batch, l tokens, h heads, p headdim, g groups (B/C shared by h/g heads),
n d_state, c chunks, q tokens per chunk.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

_NO_DT_LIMIT = (0.0, math.inf)
# seq_idx of the chunk-padding tokens: their own sequence, above every real index (indices count
# sequences), known without reading seq_idx back from the device.
_PAD_SEQ_ID = torch.iinfo(torch.int64).max


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def discretize_dt(dt: torch.Tensor, dt_bias: Optional[torch.Tensor], dt_softplus: bool,
                  dt_limit: tuple[float, float]) -> torch.Tensor:
    """The step sizes the scan uses: bias, softplus, then the clamp to ``dt_limit``."""
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = F.softplus(dt)  # threshold 20 (linear above), as the kernel
    if tuple(dt_limit) != _NO_DT_LIMIT:
        dt = dt.clamp(min=dt_limit[0], max=dt_limit[1])
    return dt


def segment_sums(log_decay: torch.Tensor) -> torch.Tensor:
    """``out[..., i, j] = sum(log_decay[..., j+1 : i+1])`` for ``i >= j``, ``-inf`` above the
    diagonal.

    Built as a cumulative sum over a strictly-lower-triangular copy (no subtraction), so it is
    exact where entries are large and stays finite under autograd.
    """
    q = log_decay.size(-1)
    strictly_lower = torch.ones(q, q, dtype=torch.bool, device=log_decay.device).tril(-1)
    repeated = log_decay.unsqueeze(-1).expand(*log_decay.shape, q)  # [..., k, j] = a_k
    sums = torch.cumsum(repeated.masked_fill(~strictly_lower, 0.0), dim=-2)
    lower = torch.ones(q, q, dtype=torch.bool, device=log_decay.device).tril(0)
    return sums.masked_fill(~lower, -math.inf)


def _pad_to_chunks(tensor: torch.Tensor, chunk_size: int, value: float = 0.0) -> torch.Tensor:
    """Pads dim 1 (tokens) at the end to a multiple of ``chunk_size``."""
    extra = (-tensor.size(1)) % chunk_size
    if extra == 0:
        return tensor
    pad_shape = list(tensor.shape)
    pad_shape[1] = extra
    return torch.cat([tensor, tensor.new_full(pad_shape, value)], dim=1)


def _heads_from_groups(tensor: torch.Tensor, nheads: int) -> torch.Tensor:
    """[b, l, g, n] -> [b, l, h, n]: head k uses group k // (h / g)."""
    groups = tensor.size(2)
    if nheads % groups:
        raise ValueError(f"nheads ({nheads}) must be divisible by ngroups ({groups})")
    return tensor.repeat_interleave(nheads // groups, dim=2)


def _chunk_scan(x, dt, log_decay, B, C, seq_idx, chunk_size):
    """The SSD scan without D or z. Inputs padded to whole chunks; returns y [b, c*q, h, p].

    x [b, L, h, p]; dt, log_decay [b, L, h]; B, C [b, L, h, n]; seq_idx [b, L] (L = c*q).
    """
    b, length, h, p = x.shape
    c, q = length // chunk_size, chunk_size
    xc = x.reshape(b, c, q, h, p)
    dtc = dt.reshape(b, c, q, h)
    Bc, Cc = B.reshape(b, c, q, h, -1), C.reshape(b, c, q, h, -1)
    seqc = seq_idx.reshape(b, c, q)

    # Within a chunk: decay from token j to token i (same sequence only), [b, c, h, q, q].
    same_sequence = seqc.unsqueeze(-1) == seqc.unsqueeze(-2)  # [b, c, i, j]
    log_weights = segment_sums(log_decay.reshape(b, c, q, h).permute(0, 1, 3, 2))
    decay = torch.exp(log_weights.masked_fill(~same_sequence.unsqueeze(2), -math.inf))
    scores = torch.einsum("bcihn,bcjhn->bchij", Cc, Bc) * decay
    y = torch.einsum("bchij,bcjh,bcjhp->bcihp", scores, dtc, xc)

    # Each chunk's own contribution to the state at its last token: decay row q-1 of the chunk.
    to_end = decay[..., q - 1, :]  # [b, c, h, j]
    chunk_states = torch.einsum("bchj,bcjh,bcjhn,bcjhp->bchpn", to_end, dtc, Bc, xc)

    # Decay from the chunk's start to token i (inclusive), zero once a new sequence began in it.
    log_from_start = torch.cumsum(log_decay.reshape(b, c, q, h), dim=2)  # [b, c, i, h]
    carried_seq = torch.cat([seqc[:, :1, :1].expand(b, 1, 1) - 1, seqc[:, :-1, -1:]], dim=1)
    continues = seqc == carried_seq  # [b, c, i]: token i still in the sequence carried in
    from_start = torch.exp(log_from_start) * continues.unsqueeze(-1)

    state = x.new_zeros(b, h, p, Bc.size(-1))
    outputs = []
    for k in range(c):
        outputs.append(torch.einsum("bihn,bhpn,bih->bihp", Cc[:, k], state, from_start[:, k]))
        state = state * from_start[:, k, q - 1].reshape(b, h, 1, 1) + chunk_states[:, k]
    y = y + torch.stack(outputs, dim=1)
    return y.reshape(b, length, h, p)


def mamba_chunk_scan_combined(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    D: Optional[torch.Tensor] = None,
    z: Optional[torch.Tensor] = None,
    dt_bias: Optional[torch.Tensor] = None,
    initial_states: Optional[torch.Tensor] = None,
    seq_idx: Optional[torch.Tensor] = None,
    cu_seqlens: Optional[torch.Tensor] = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = _NO_DT_LIMIT,
    return_final_states: bool = False,
    return_varlen_states: bool = False,
) -> torch.Tensor:
    """Same call as ``mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined`` (training).

    Args:
        x: [b, l, h, p]; dt: [b, l, h]; A: [h] (negative); B, C: [b, l, g, n].
        chunk_size: tokens per chunk (only changes the arithmetic order, not the result).
        D: [h] or [h, p] skip connection; z: [b, l, h, p] gate (``y * silu(z)``).
        dt_bias, dt_softplus, dt_limit: the step-size discretisation (:func:`discretize_dt`).
        seq_idx: [b, l] int, non-decreasing along l; tokens with different values never
            exchange state.

    Returns:
        y [b, l, h, p] in ``x``'s dtype.

    Raises:
        NotImplementedError: for the inference-only options (initial states, final or varlen
            states, cu_seqlens), which the training mixer never passes.
    """
    if initial_states is not None or return_final_states or return_varlen_states \
            or cu_seqlens is not None:
        raise NotImplementedError(
            "the plain-torch SSD scan implements the training call only (no initial/final/"
            "varlen states, no cu_seqlens); install mamba_ssm for inference")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    out_dtype, work = x.dtype, _compute_dtype(x)
    b, length, h, _ = x.shape
    if length == 0:
        return x.clone()
    dt = discretize_dt(dt.to(work), None if dt_bias is None else dt_bias.to(work),
                       dt_softplus, dt_limit)
    log_decay = dt * A.to(work).reshape(1, 1, h)
    Bh = _heads_from_groups(B.to(work), h)
    Ch = _heads_from_groups(C.to(work), h)
    if seq_idx is None:
        seq_idx = torch.zeros(b, length, dtype=torch.long, device=x.device)
    seq_idx = seq_idx.to(torch.long)
    # Padding tokens form their own sequence and carry x = dt = 0.
    padded = [_pad_to_chunks(t, chunk_size) for t in (x.to(work), dt, log_decay, Bh, Ch)]
    seq_padded = _pad_to_chunks(seq_idx, chunk_size, value=_PAD_SEQ_ID)
    y = _chunk_scan(*padded, seq_padded, chunk_size)[:, :length]
    xw = x.to(work)
    if D is not None:
        Dw = D.to(work)
        y = y + xw * (Dw.reshape(1, 1, h, 1) if Dw.dim() == 1 else Dw.reshape(1, 1, h, -1))
    if z is not None:
        y = y * F.silu(z.to(work))
    return y.to(out_dtype)
