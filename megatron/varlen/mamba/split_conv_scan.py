"""Plain-torch twin of mamba_ssm's ``mamba_split_conv1d_scan_combined`` (the mixer's training path).

megatron-core's ``MambaMixer._ssm_training`` hands the whole in-projection ``zxBCdt`` to this
one fused call: split into the gate ``z``, the convolved stream ``xBC`` and the step sizes
``dt``; causal convolution + SiLU over ``xBC``; split that into ``x, B, C``; SSD scan with the
``D`` skip and the ``silu(z)`` gate. The twin composes :func:`causal_conv1d_fn` and
:func:`mamba_chunk_scan_combined`; the gated RMSNorm and the out-projection the kernel can fuse
are left to the caller (the mixer passes neither).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from megatron.varlen.mamba.causal_conv import causal_conv1d_fn
from megatron.varlen.mamba.ssd_scan import mamba_chunk_scan_combined


def _split_sizes(zxbcdt, conv1d_weight, D, headdim, ngroups):
    """(dim, d_state, nheads, headdim) from the shapes, checked like the kernel checks them."""
    if D.dim() == 1:
        if headdim is None:
            raise ValueError("headdim must be passed when D is 1-D")
        nheads = D.size(0)
    else:
        nheads, headdim = D.shape
    dim = nheads * headdim
    d_state = (conv1d_weight.size(0) - dim) // ngroups // 2
    expected = 2 * dim + 2 * ngroups * d_state + nheads
    if zxbcdt.size(-1) != expected:
        raise ValueError(
            f"zxbcdt has {zxbcdt.size(-1)} features, expected 2*{dim} + 2*{ngroups}*{d_state} "
            f"+ {nheads} = {expected} (extra non-SSM features are not supported)")
    return dim, d_state, nheads, headdim


def mamba_split_conv1d_scan_combined(
    zxbcdt: torch.Tensor,
    conv1d_weight: torch.Tensor,
    conv1d_bias: Optional[torch.Tensor],
    dt_bias: torch.Tensor,
    A: torch.Tensor,
    D: torch.Tensor,
    chunk_size: int,
    initial_states: Optional[torch.Tensor] = None,
    seq_idx: Optional[torch.Tensor] = None,
    dt_limit: tuple[float, float] = (0.0, math.inf),
    return_final_states: bool = False,
    activation: str = "silu",
    rmsnorm_weight: Optional[torch.Tensor] = None,
    rmsnorm_eps: float = 1e-6,
    outproj_weight: Optional[torch.Tensor] = None,
    outproj_bias: Optional[torch.Tensor] = None,
    headdim: Optional[int] = None,
    ngroups: int = 1,
    norm_before_gate: bool = True,
) -> torch.Tensor:
    """Same call as mamba_ssm's fused training kernel; returns [b, l, dim] = ``y * silu(z)``.

    Raises:
        NotImplementedError: the fused RMSNorm / out-projection or inference states (the mixer
            passes none of them).
    """
    del rmsnorm_eps, norm_before_gate  # only meaningful with the fused norm
    if rmsnorm_weight is not None or outproj_weight is not None or outproj_bias is not None:
        raise NotImplementedError(
            "the plain-torch twin does not fuse the gated RMSNorm or the out-projection")
    if initial_states is not None or return_final_states:
        raise NotImplementedError("the plain-torch twin has no initial/final states")
    dim, d_state, nheads, headdim = _split_sizes(zxbcdt, conv1d_weight, D, headdim, ngroups)
    z, xBC, dt = torch.split(zxbcdt, [dim, dim + 2 * ngroups * d_state, nheads], dim=-1)
    xBC = causal_conv1d_fn(xBC.transpose(1, 2), conv1d_weight, conv1d_bias, seq_idx=seq_idx,
                           activation=activation).transpose(1, 2)
    x, B, C = torch.split(xBC, [dim, ngroups * d_state, ngroups * d_state], dim=-1)
    batch, length = zxbcdt.shape[:2]
    y = mamba_chunk_scan_combined(
        x.reshape(batch, length, nheads, headdim), dt, A,
        B.reshape(batch, length, ngroups, d_state), C.reshape(batch, length, ngroups, d_state),
        chunk_size, D=D, z=z.reshape(batch, length, nheads, headdim), dt_bias=dt_bias,
        seq_idx=seq_idx, dt_softplus=True, dt_limit=dt_limit,
    )
    return y.reshape(batch, length, dim)
