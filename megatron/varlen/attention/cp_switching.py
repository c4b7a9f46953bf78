"""``SelfAttention`` that runs each micro-batch on the CP group the micro-batch carries.

Inside megatron-core 0.16.1's ``Attention.forward`` two things read the CP group:

* RoPE on the THD path: ``apply_rotary_pos_emb(..., cu_seqlens=<padded>,
  cp_group=self.pg_collection.cp)`` picks, per sequence, the frequencies of this rank's two
  chunks from the group's size and rank;
* the core attention (ours resolves ``packed_seq_params.cp_group`` itself and also has its
  ``cp_group`` attribute swapped; TE's ``TEDotProductAttention`` re-targets itself from
  ``packed_seq_params`` in its own forward).

``GPTModel._preprocess`` already passes ``packed_seq_params.cp_group`` to ``RotaryEmbedding``,
which for THD returns the full-length table (``max_seqlen`` rows, no CP slicing); the CP
slicing happens in ``apply_rotary_pos_emb``, i.e. here. For SBHD micro-batches the table is
sliced in ``RotaryEmbedding.forward`` with the micro-batch's group, so nothing more is needed.

:class:`CPSwitchingSelfAttention` swaps ``self.pg_collection`` (a copy with ``cp`` replaced)
and (for our core attention) ``core_attention.cp_group`` for the call and restores them in a
``finally``.
"""

from __future__ import annotations

import inspect
from typing import Any

from megatron.core.transformer.attention import SelfAttention

from megatron.varlen.attention.core_attention import VarlenCoreAttention
from megatron.varlen.attention.cp_group import carries_cp_group, resolve_cp_group, use_cp_group
from megatron.varlen.packing.packed_seq import with_host_boundaries

_PACKED_SEQ_PARAMS = "packed_seq_params"
_FORWARD_SIGNATURE = inspect.signature(SelfAttention.forward)


def _packed_seq_params_of(module: Any, args: tuple, kwargs: dict) -> Any:
    """``packed_seq_params`` of a ``SelfAttention.forward`` call, positional or keyword."""
    if _PACKED_SEQ_PARAMS in kwargs:
        return kwargs[_PACKED_SEQ_PARAMS]
    bound = _FORWARD_SIGNATURE.bind_partial(module, *args, **kwargs)
    return bound.arguments.get(_PACKED_SEQ_PARAMS)


class CPSwitchingSelfAttention(SelfAttention):
    """``SelfAttention`` whose RoPE and core attention follow ``packed_seq_params.cp_group``.

    Same constructor and forward as megatron-core's ``SelfAttention`` (a spec swap, not an
    edit). When the micro-batch carries a CP group (or ``local_cp_size``), the call runs inside
    :meth:`use_cp_group`; otherwise it is exactly the parent's forward.
    """

    def cp_consumers(self) -> list[Any]:
        """The objects whose CP group must follow the micro-batch.

        Always this module (its ``pg_collection.cp`` feeds RoPE). Our core attention too; TE's
        is left alone: it re-targets itself from ``packed_seq_params`` through
        ``set_context_parallel_group``, and setting its ``cp_group`` attribute behind its back
        would desynchronise its internal CP state.
        """
        if isinstance(self.core_attention, VarlenCoreAttention):
            return [self, self.core_attention]
        return [self]

    def use_cp_group(self, group: Any):
        """Context manager: this layer's CP consumers use ``group`` inside the block."""
        return use_cp_group(self.cp_consumers(), group)

    def _with_host_boundaries(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """For our core attentions: the call with ``packed_seq_params`` swapped for its view
        with host boundaries (RoPE then reads no boundary back from the device)."""
        packed_seq_params = _packed_seq_params_of(self, args, kwargs)
        if packed_seq_params is None or not isinstance(self.core_attention, VarlenCoreAttention):
            return args, kwargs
        host_view = with_host_boundaries(packed_seq_params)
        if host_view is packed_seq_params:
            return args, kwargs
        bound = _FORWARD_SIGNATURE.bind_partial(self, *args, **kwargs)
        bound.arguments[_PACKED_SEQ_PARAMS] = host_view
        return bound.args[1:], bound.kwargs

    def forward(self, *args, **kwargs):
        """``SelfAttention.forward`` on the micro-batch's CP group (restored afterwards)."""
        args, kwargs = self._with_host_boundaries(args, kwargs)
        packed_seq_params = _packed_seq_params_of(self, args, kwargs)
        if not carries_cp_group(packed_seq_params):
            return super().forward(*args, **kwargs)
        group = resolve_cp_group(packed_seq_params, self.pg_collection.cp)
        with self.use_cp_group(group):
            return super().forward(*args, **kwargs)
