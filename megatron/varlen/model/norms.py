"""A plain-torch LayerNorm/RMSNorm that supports sequence parallelism and zero-centered gamma.

megatron-core's ``WrappedTorchNorm`` asserts ``not config.sequence_parallel`` (its SP-capable
norms come from Apex/Transformer Engine, which need CUDA). Under SP each TP rank normalises a
different slice of the sequence, so the norm's weight/bias gradients are partial sums: marking
the parameters ``sequence_parallel = True`` makes megatron-core's finalize_model_grads all-reduce
them over the TP group, which is all SP needs from a norm.

``WrappedTorchNorm`` also refuses ``layernorm_zero_centered_gamma`` (Megatron-LM's
``--apply-layernorm-1p``), which megatron-core's fused and Transformer Engine norms implement:
the weight is stored as gamma - 1, initialised to zeros, and the norm scales by weight + 1. The
subclasses below do the same in plain torch; parameter names stay ``weight``/``bias``, so
checkpoints keep megatron-core's layout.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class ZeroCenteredLayerNorm(torch.nn.LayerNorm):
    """LayerNorm whose stored weight is gamma - 1 (megatron-core's FusedLayerNorm with
    ``zero_centered_gamma``)."""

    zero_centered_gamma = True  # what megatron-core's and TE's norms call the attribute

    def reset_parameters(self) -> None:
        torch.nn.init.zeros_(self.weight)
        torch.nn.init.zeros_(self.bias)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(input, self.normalized_shape, self.weight + 1, self.bias, self.eps)


class ZeroCenteredRMSNorm(torch.nn.RMSNorm):
    """RMSNorm whose stored weight is gamma - 1 (Transformer Engine's RMSNorm with
    ``zero_centered_gamma``)."""

    zero_centered_gamma = True

    def reset_parameters(self) -> None:
        torch.nn.init.zeros_(self.weight)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(input, self.normalized_shape, self.weight + 1, self.eps)


_NORMS = {"LayerNorm": torch.nn.LayerNorm, "RMSNorm": torch.nn.RMSNorm}
_ZERO_CENTERED_NORMS = {"LayerNorm": ZeroCenteredLayerNorm, "RMSNorm": ZeroCenteredRMSNorm}


class VarlenNorm:
    """Builder with WrappedTorchNorm's signature, usable in a ModuleSpec."""

    def __new__(cls, config, hidden_size: int, eps: float = 1e-5, persist_layer_norm=False,
                zero_centered_gamma=False, normalization: str = "LayerNorm"):
        del persist_layer_norm  # a fused-kernel option with no meaning in plain torch
        kind = getattr(config, "normalization", normalization)
        if kind not in _NORMS:
            raise ValueError(f"normalization {kind!r} is not one of {sorted(_NORMS)}")
        # megatron-core's norms read the config's field (the keyword is their signature's)
        centered = zero_centered_gamma or getattr(config, "layernorm_zero_centered_gamma", False)
        norm = (_ZERO_CENTERED_NORMS if centered else _NORMS)[kind](hidden_size, eps=eps)
        for param in norm.parameters():
            param.sequence_parallel = bool(config.sequence_parallel)
        return norm
