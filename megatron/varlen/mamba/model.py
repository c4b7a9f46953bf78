"""``MambaModel`` with the training loop's call signature.

The loop calls every model chunk as ``model(tokens, position_ids, mask, labels=...,
packed_seq_params=..., loss_mask=...)`` (GPTModel's signature; ``loss_mask`` only feeds MTP
there). megatron-core's ``MambaModel.forward`` has no ``loss_mask``: it is accepted and ignored
(hybrid models have no MTP here).
"""

from __future__ import annotations

from megatron.varlen.mamba import triton_stand_in

triton_stand_in.install()  # before megatron.core.ssm (see triton_stand_in.py)

from megatron.core.models.mamba.mamba_model import MambaModel  # noqa: E402


class VarlenMambaModel(MambaModel):
    """``MambaModel`` that accepts (and ignores) the loop's ``loss_mask`` keyword."""

    def forward(self, *args, loss_mask=None, **kwargs):
        del loss_mask  # only GPTModel's MTP reads it
        return super().forward(*args, **kwargs)
