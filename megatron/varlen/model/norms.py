"""A plain-torch LayerNorm/RMSNorm that supports sequence parallelism.

megatron-core's ``WrappedTorchNorm`` asserts ``not config.sequence_parallel`` (its SP-capable
norms come from Apex/Transformer Engine, which need CUDA). Under SP each TP rank normalises a
different slice of the sequence, so the norm's weight/bias gradients are partial sums: marking
the parameters ``sequence_parallel = True`` makes megatron-core's finalize_model_grads all-reduce
them over the TP group, which is all SP needs from a norm.
"""

from __future__ import annotations

import torch

_NORMS = {"LayerNorm": torch.nn.LayerNorm, "RMSNorm": torch.nn.RMSNorm}


class VarlenNorm:
    """Builder with WrappedTorchNorm's signature, usable in a ModuleSpec."""

    def __new__(cls, config, hidden_size: int, eps: float = 1e-5, persist_layer_norm=False,
                zero_centered_gamma=False, normalization: str = "LayerNorm"):
        del persist_layer_norm  # a fused-kernel option with no meaning in plain torch
        if zero_centered_gamma or getattr(config, "layernorm_zero_centered_gamma", False):
            raise ValueError("zero-centered gamma is not supported by the plain-torch norm")
        kind = getattr(config, "normalization", normalization)
        if kind not in _NORMS:
            raise ValueError(f"normalization {kind!r} is not one of {sorted(_NORMS)}")
        norm = _NORMS[kind](hidden_size, eps=eps)
        for param in norm.parameters():
            param.sequence_parallel = bool(config.sequence_parallel)
        return norm
