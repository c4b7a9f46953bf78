"""Plain-torch twin of mamba_ssm's gated RMSNorm (``RMSNormGated``), as the Mamba mixer uses it.

megatron-core's mixer builds ``ExtendedRMSNorm(d_inner_local_tp, eps, group_size,
norm_before_gate, device, dtype)`` -- mamba_ssm's Triton norm with a sharded state dict. Without
mamba_ssm that class is a ``MagicMock`` subclass, so the mixer gets this one instead (see
``mixer.py``). The norm is taken over groups of ``group_size`` channels (one group per Mamba
group of heads, so TP and CP, which split whole groups, never change it):

    out = rmsnorm_groups(x * silu(z)) * weight     (norm_before_gate=False, the mixer's choice)
    out = rmsnorm_groups(x) * weight * silu(z)     (norm_before_gate=True)
    out = rmsnorm_groups(x) * weight               (z is None)
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from megatron.core import parallel_state
from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint


class GatedRMSNorm(torch.nn.Module):
    """``RMSNormGated``'s constructor and ``forward(x, z=None)``, computed in float32 (or 64)."""

    def __init__(self, hidden_size: int, eps: float = 1e-5, group_size: Optional[int] = None,
                 norm_before_gate: bool = True, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.group_size = group_size or hidden_size
        if hidden_size % self.group_size:
            raise ValueError(f"hidden_size {hidden_size} is not a multiple of group_size "
                             f"{self.group_size}")
        self.norm_before_gate = norm_before_gate
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))

    def _normalise(self, x: torch.Tensor) -> torch.Tensor:
        grouped = x.reshape(*x.shape[:-1], -1, self.group_size)
        scale = torch.rsqrt(grouped.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (grouped * scale).reshape(x.shape)

    def forward(self, x: torch.Tensor, z: Optional[torch.Tensor] = None) -> torch.Tensor:
        dtype = x.dtype
        work = torch.float64 if dtype == torch.float64 else torch.float32
        x = x.to(work)
        gate = None if z is None else F.silu(z.to(work))
        if gate is not None and not self.norm_before_gate:
            x = x * gate
        out = self._normalise(x) * self.weight.to(work)
        if gate is not None and self.norm_before_gate:
            out = out * gate
        return out.to(dtype)

    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
        """The weight is split over TP along dim 0 (as megatron-core's ``ExtendedRMSNorm``)."""
        state_dict = self.state_dict(prefix="", keep_vars=True)
        return make_sharded_tensors_for_checkpoint(
            state_dict, prefix, {"weight": 0}, sharded_offsets,
            tp_group=parallel_state.get_tensor_model_parallel_group(),
            dp_cp_group=(metadata or {}).get("dp_cp_group"),
        )
