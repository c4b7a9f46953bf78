"""megatron-core's multi-latent attention (DeepSeek-V2/V3 MLA) on packed THD micro-batches.

:class:`VarlenMLASelfAttention` is megatron-core 0.16.1's ``MLASelfAttention`` (its down/up
projections, latent norms, the split of each query/key head into ``qk_head_dim`` plain and
``qk_pos_emb_head_dim`` rotated channels, its own RoPE or YaRN table, the softmax scale
``mscale^2 / sqrt(qk_head_dim + qk_pos_emb_head_dim)``) with this fork's core attention in the
``core_attention`` slot, which takes keys wider than values (``k_channels`` != ``v_channels``).

What the subclass changes is the micro-batch's ``PackedSeqParams`` it hands to the parent:

* ``local_cp_size`` and ``cp_group`` are cleared: the packing layer always sets them (1 without
  CP), and megatron-core's MLA asserts ``local_cp_size is None`` (its refusal of dynamic CP).
  That is only right while the micro-batch runs on the layer's static CP group (static
  --context-parallel-size: the same size and ranks), which start-up guarantees (mla_arguments.py
  refuses MLA with --dynamic-context-parallel) and :meth:`forward` checks: MLA's RoPE picks each
  sequence's CP chunks from the layer's static group, never the micro-batch's.
* for our plain-torch core attentions, the boundaries are the host copies (as in
  :class:`~megatron.varlen.attention.cp_switching.CPSwitchingSelfAttention`): megatron-core's
  THD RoPE then reads no device tensor back in every layer.

Without Transformer Engine, megatron-core 0.16.1 imports TE's classes as ``MagicMock`` stand-ins
and still sets its ``HAVE_TE``; ``MultiLatentAttention.__init__`` then calls
``isinstance(linear_proj, TELinear)`` with a mock, a TypeError. :meth:`__init__` builds the
layer with a class nothing is an instance of in that slot (:func:`_te_linear_stand_in`), only
when the imported ``TELinear`` is not a class.

RoPE on THD runs in megatron-core: ``apply_rotary_pos_emb`` walks the padded boundaries, so
every packed sequence starts at position 0 (the table has ``max_seqlen`` rows, the longest
sequence of the pack, as the packing layer sets it).
"""

from __future__ import annotations

import dataclasses
import inspect

import torch

from megatron.core.transformer import multi_latent_attention
from megatron.core.transformer.multi_latent_attention import MLASelfAttention

from megatron.varlen.attention.core_attention import VarlenCoreAttention
from megatron.varlen.attention.cp_group import swap_attributes
from megatron.varlen.packing.packed_seq import has_host_boundaries, with_host_boundaries

_PACKED_SEQ_PARAMS = "packed_seq_params"
_FORWARD_SIGNATURE = inspect.signature(MLASelfAttention.forward)
_MLA_VIEW = "mla-view"  # kind of the micro-batch cache's entry


class _NoTELinear:
    """Nothing is an instance of it: what ``TELinear`` means where TE is not installed."""


def _te_linear_stand_in() -> list:
    """The attribute swap that lets megatron-core's MLA build without TE (module docstring)."""
    if isinstance(multi_latent_attention.TELinear, type):
        return []
    return [(multi_latent_attention, "TELinear", _NoTELinear)]


def _ranks(group) -> list[int]:
    return torch.distributed.get_process_group_ranks(group)


def _is_static_group(params, static) -> bool:
    """Whether the micro-batch runs on the layer's static CP group (its size, and with CP its
    ranks): then clearing the micro-batch's own group changes nothing."""
    size, group = int(params.local_cp_size or 1), params.cp_group
    if size != static.size():
        return False
    return size == 1 or group is None or _ranks(group) == _ranks(static)


def _static_cp_view(params):
    """``params`` with ``local_cp_size`` and ``cp_group`` cleared (one copy per micro-batch when
    it carries a cache)."""
    build = lambda: dataclasses.replace(params, local_cp_size=None, cp_group=None)
    if has_host_boundaries(params):
        return params.derived.get((_MLA_VIEW, id(params.cp_group), params.local_cp_size), build)
    return build()


class VarlenMLASelfAttention(MLASelfAttention):
    """``MLASelfAttention`` fed packed micro-batches of this fork (module docstring); same
    constructor and forward."""

    def __init__(self, *args, **kwargs):
        with swap_attributes(_te_linear_stand_in()):
            super().__init__(*args, **kwargs)

    def _micro_batch_params(self, params):
        if params is None:
            return None
        if isinstance(self.core_attention, VarlenCoreAttention):
            params = with_host_boundaries(params)
        static = self.pg_collection.cp
        if not _is_static_group(params, static):
            raise ValueError(
                f"multi-latent attention runs on the static CP group only (size "
                f"{static.size()}; this micro-batch's: {int(params.local_cp_size or 1)}): "
                f"megatron-core 0.16.1's MLA RoPE uses the static group; drop "
                f"--dynamic-context-parallel")
        return _static_cp_view(params)

    def forward(self, *args, **kwargs):
        """``MLASelfAttention.forward`` with the micro-batch's params made MLA's (see above)."""
        bound = _FORWARD_SIGNATURE.bind_partial(self, *args, **kwargs)
        if _PACKED_SEQ_PARAMS in bound.arguments:
            bound.arguments[_PACKED_SEQ_PARAMS] = self._micro_batch_params(
                bound.arguments[_PACKED_SEQ_PARAMS])
        return super().forward(*bound.args[1:], **bound.kwargs)
