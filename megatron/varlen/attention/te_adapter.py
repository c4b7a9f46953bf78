"""GPU adapter: Transformer Engine's fused attention when TE and CUDA are both present.

megatron-core's ``TEDotProductAttention`` already speaks the same protocol as
:class:`~megatron.varlen.attention.core_attention.VarlenCoreAttention` (THD through
``packed_seq_params`` with ``cu_seqlens*_padded``, per-micro-batch CP group from
``packed_seq_params.cp_group``), so the adapter only decides whether it can be used. On this
project's CPU machines it always returns None; the GPU branch is not exercised by the tests.
"""

from __future__ import annotations

import importlib.util
from typing import Optional

import torch

_TE_PACKAGE = "transformer_engine"


def get_te_core_attention() -> Optional[type]:
    """``TEDotProductAttention`` if Transformer Engine imports and CUDA is available, else None."""
    if not torch.cuda.is_available() or importlib.util.find_spec(_TE_PACKAGE) is None:
        return None
    try:
        from megatron.core.extensions.transformer_engine import TEDotProductAttention
    except ImportError:
        return None
    return TEDotProductAttention
