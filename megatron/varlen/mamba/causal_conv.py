"""Plain-torch twin of ``causal_conv1d.causal_conv1d_fn`` (the Mamba mixer's short convolution).

A depthwise causal convolution of width ``w``: output token ``t`` of channel ``d`` is

    out[d, t] = bias[d] + sum_{s=0}^{w-1} weight[d, w-1-s] * x[d, t-s]

where a term only counts when token ``t-s`` exists and has the same ``seq_idx`` as token ``t``,
so no window crosses a packed-sequence boundary (tokens before a sequence start read as zeros,
exactly as at the start of the stream). Optional SiLU activation. Differentiable by autograd.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

_ACTIVATIONS = (None, "silu", "swish")


def _shifted(tensor: torch.Tensor, shift: int) -> torch.Tensor:
    """``tensor`` moved ``shift`` steps later along the last dim, zeros shifted in."""
    if shift == 0:
        return tensor
    return F.pad(tensor, (shift, 0))[..., : tensor.size(-1)]


def causal_conv1d_fn(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    seq_idx: Optional[torch.Tensor] = None,
    initial_states: Optional[torch.Tensor] = None,
    return_final_states: bool = False,
    final_states_out: Optional[torch.Tensor] = None,
    activation: Optional[str] = None,
) -> torch.Tensor:
    """Same call as ``causal_conv1d.causal_conv1d_fn`` for training.

    Args:
        x: [b, d, l]; weight: [d, w]; bias: [d] or None.
        seq_idx: [b, l] int (non-decreasing along l) or None.
        activation: None, "silu" or "swish".

    Returns:
        [b, d, l] in ``x``'s dtype.

    Raises:
        NotImplementedError: initial or final states (inference only).
        ValueError: an unknown activation.
    """
    if initial_states is not None or return_final_states or final_states_out is not None:
        raise NotImplementedError(
            "the plain-torch causal conv implements the training call only (no initial/final "
            "states); install causal_conv1d for inference")
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {_ACTIVATIONS}, got {activation!r}")
    width = weight.size(-1)
    out = torch.zeros_like(x)
    for shift in range(width):
        term = _shifted(x, shift) * weight[:, width - 1 - shift].unsqueeze(-1)
        if seq_idx is not None and shift > 0:
            same = (_shifted(seq_idx.long() + 1, shift) == seq_idx.long() + 1).unsqueeze(1)
            term = term * same.to(term.dtype)
        out = out + term
    if bias is not None:
        out = out + bias.unsqueeze(-1).to(out.dtype)
    if activation is not None:
        out = F.silu(out)
    return out
