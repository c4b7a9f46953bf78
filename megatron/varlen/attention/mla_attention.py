"""megatron-core's multi-latent attention (DeepSeek-V2/V3 MLA) on packed THD micro-batches.

:class:`VarlenMLASelfAttention` is megatron-core 0.16.1's ``MLASelfAttention`` (its down/up
projections, latent norms, the split of each query/key head into ``qk_head_dim`` plain and
``qk_pos_emb_head_dim`` rotated channels, its own RoPE or YaRN table, the softmax scale
``mscale^2 / sqrt(qk_head_dim + qk_pos_emb_head_dim)``) with this fork's core attention in the
``core_attention`` slot, which takes keys wider than values (``k_channels`` != ``v_channels``).

What the subclass changes is the micro-batch's ``PackedSeqParams`` it hands to the parent:

* ``local_cp_size`` and ``cp_group`` are cleared: the packing layer always sets them (1 without
  CP), and megatron-core's MLA asserts ``local_cp_size is None`` (its refusal of dynamic CP).
  Its RoPE places each sequence's CP chunks by the layer's ``pg_collection.cp`` instead, so
  under dynamic CP :meth:`forward` points that (a copy of the collection), our core attention's
  ``cp_group`` and the config's ``context_parallel_size`` at the micro-batch's group for the
  call (megatron-core's MLA keeps a packed micro-batch's whole RoPE table only when that size
  is above 1) and restores them in a ``finally``. Static CP needs no swap: the micro-batch's
  group is the static one. TE's core attention takes its group from the params: static CP only
  (start-up refuses it with dynamic CP).
* for our plain-torch core attentions, the boundaries are the host copies (as in
  :class:`~megatron.varlen.attention.cp_switching.CPSwitchingSelfAttention`): megatron-core's
  THD RoPE then reads no device tensor back in every layer.

Without Transformer Engine, megatron-core 0.16.1 imports TE's classes as ``MagicMock`` stand-ins
and still sets its ``HAVE_TE``; ``MultiLatentAttention.__init__`` then calls
``isinstance(linear_proj, TELinear)`` with a mock, a TypeError. :meth:`__init__` builds the
layer with a class nothing is an instance of in that slot (:func:`_te_linear_stand_in`), only
when the imported ``TELinear`` is not a class.

``--recompute-modules mla_up_proj``: megatron-core recomputes the up projections and RoPE in
backward (an output-discarding checkpoint taken in ``get_query_key_value_tensors``), after
:meth:`forward` has restored the static group; RoPE there reads ``pg_collection.cp`` and the
config's CP size at call time. :meth:`get_query_key_value_tensors` binds the call's group into
the checkpointed function, so the recomputation runs on the micro-batch's group again.

RoPE on THD runs in megatron-core: ``apply_rotary_pos_emb`` walks the padded boundaries, so
every packed sequence starts at position 0 (the table has ``max_seqlen`` rows, the longest
sequence of the pack, as the packing layer sets it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect

import torch

from megatron.core.transformer import multi_latent_attention
from megatron.core.transformer.multi_latent_attention import MLASelfAttention

from megatron.varlen.attention.core_attention import VarlenCoreAttention
from megatron.varlen.attention.cp_switching import call_arguments
from megatron.varlen.attention.cp_group import (
    cp_assignments, resolve_cp_group, swap_attributes,
)
from megatron.varlen.packing.packed_seq import has_host_boundaries, with_host_boundaries

_PACKED_SEQ_PARAMS = "packed_seq_params"
_FORWARD_SIGNATURE = inspect.signature(MLASelfAttention.forward)  # bound only for unusual calls
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

    def _micro_batch_group(self, params):
        """The CP group this call runs on: the micro-batch's (dynamic CP), else the static one.
        TE's core attention takes its group from ``packed_seq_params``, which MLA must not
        carry: it runs on the static group only."""
        static = self.pg_collection.cp
        if params is None or _is_static_group(params, static):
            return static
        if not isinstance(self.core_attention, VarlenCoreAttention):
            raise ValueError(
                "multi-latent attention with Transformer Engine's attention runs on the static "
                "CP group only: drop --dynamic-context-parallel or use --attention-backend "
                "local/flash")
        return resolve_cp_group(params, static)

    def _on_group(self, group):
        """Context: RoPE (``pg_collection.cp``), our core attention and the config's CP size
        (megatron-core's MLA keeps the whole RoPE table of a packed micro-batch only when that
        size is above 1) follow ``group``; all restored afterwards."""
        if group is self.pg_collection.cp:
            return contextlib.nullcontext()
        consumers = [self, self.core_attention]
        assignments = [a for module in consumers for a in cp_assignments(module, group)]
        assignments.append((self.config, "context_parallel_size", group.size()))
        return swap_attributes(assignments)

    def get_query_key_value_tensors(self, *args, **kwargs):
        """megatron-core's; a ``mla_up_proj`` checkpoint it took recomputes on this call's CP
        group (module docstring)."""
        result = super().get_query_key_value_tensors(*args, **kwargs)
        if self.qkv_up_checkpoint is not None:
            checkpoint = self.qkv_up_checkpoint
            checkpoint.run_function = self._on_this_group(checkpoint.run_function)
        return result

    def _on_this_group(self, function):
        """``function`` run on the CP group of the running call (the one :meth:`forward`
        swapped in), whenever it is called."""
        group = self.pg_collection.cp

        def on_group(*inputs):
            with self._on_group(group):
                return function(*inputs)

        return on_group

    def forward(self, *args, **kwargs):
        """``MLASelfAttention.forward`` with the micro-batch's params made MLA's (see above)."""
        args, keywords = call_arguments(self, args, kwargs, _FORWARD_SIGNATURE)
        params = keywords.get(_PACKED_SEQ_PARAMS)
        group = self._micro_batch_group(params)
        if params is not None:
            if isinstance(self.core_attention, VarlenCoreAttention):
                params = with_host_boundaries(params)
            keywords[_PACKED_SEQ_PARAMS] = _static_cp_view(params)
        with self._on_group(group):
            return super().forward(*args, **keywords)
