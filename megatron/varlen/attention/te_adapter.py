"""GPU adapter: Transformer Engine's fused attention when TE and CUDA are both present.

megatron-core's ``TEDotProductAttention`` already speaks the same protocol as
:class:`~megatron.varlen.attention.core_attention.VarlenCoreAttention` (THD through
``packed_seq_params`` with ``cu_seqlens*_padded``, per-micro-batch CP group from
``packed_seq_params.cp_group``), so the adapter only decides whether it can be used. On this
project's CPU machines it always returns None; the GPU branch is not exercised by the tests.
"""

from __future__ import annotations

from typing import Optional

from megatron.varlen.platform import accelerator


def get_te_core_attention() -> Optional[type]:
    """``TEDotProductAttention`` if Transformer Engine imports and CUDA is this process's device
    (the one TE check of the model side: :func:`accelerator.te_available`), else None."""
    if not accelerator.te_available():
        return None
    from megatron.core.extensions.transformer_engine import TEDotProductAttention
    return TEDotProductAttention
