"""``SelfAttention`` that runs each micro-batch on the CP group the micro-batch carries, and
applies RoPE on the THD path from one table per micro-batch.

Inside megatron-core 0.16.1's ``Attention.forward`` two things read the CP group:

* RoPE on the THD path: ``apply_rotary_pos_emb(..., cu_seqlens=<padded>,
  cp_group=self.pg_collection.cp)`` picks, per sequence, the frequencies of this rank's two
  chunks from the group's size and rank;
* the core attention (ours resolves ``packed_seq_params.cp_group`` itself and also has its
  ``cp_group`` attribute swapped; TE's ``TEDotProductAttention`` re-targets itself from
  ``packed_seq_params`` in its own forward).

``GPTModel._preprocess`` already passes ``packed_seq_params.cp_group`` to ``RotaryEmbedding``,
which for THD returns the full-length table (``max_seqlen`` rows, no CP slicing); the CP
slicing happens in ``apply_rotary_pos_emb`` (or in our one-table RoPE below), i.e. here,
under the micro-batch's group. For SBHD micro-batches the table is sliced in
``RotaryEmbedding.forward`` with the micro-batch's group, so nothing more is needed.

RoPE (:mod:`megatron.varlen.attention.packed_rope`): where our core attention runs a THD
micro-batch, the layer calls ``SelfAttention.forward`` with ``rotary_pos_emb=None`` and rotates
q and k itself, in :meth:`CPSwitchingSelfAttention.get_query_key_value_tensors` (the step of the
parent's forward that makes q and k, right where the parent would apply RoPE next), from the
micro-batch's one cos/sin table
(:func:`~megatron.varlen.attention.packed_rope.packed_rope_table`), bit for bit what
megatron-core's ``apply_rotary_pos_emb`` gives, with no per-sequence host work. Everything else
keeps megatron-core's own RoPE, decided in :meth:`_packed_rope_freqs`: TE's core attention,
SBHD, inference, ``apply_rope_fusion``, multi-latent attention, mRoPE, offloaded QKV
activations, q and k tables that differ, and layers without RoPE (``no_rope_freq``). The
parent's forward stays untouched, so selective recomputation (``core_attn``: RoPE is outside the
recomputed part, as in the parent), full recomputation (the forward runs again on the same
micro-batch, same cached table), MTP and hybrid stacks (the same class) need nothing more.

:class:`CPSwitchingSelfAttention` swaps ``self.pg_collection`` (a copy with ``cp`` replaced)
and (for our core attention) ``core_attention.cp_group`` for the call and restores them in a
``finally``; the micro-batch's RoPE request is installed and removed the same way.
"""

from __future__ import annotations

import inspect
from typing import Any, Optional

import torch
from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import (
    _yarn_get_concentration_factor_from_config,
)
from megatron.core.transformer.attention import SelfAttention

from megatron.varlen.attention.core_attention import VarlenCoreAttention
from megatron.varlen.attention.cp_group import (
    carries_cp_group,
    resolve_cp_group,
    swap_attributes,
    use_cp_group,
)
from megatron.varlen.attention.packed_rope import packed_rope_table
from megatron.varlen.packing.packed_seq import with_host_boundaries

_PACKED_SEQ_PARAMS = "packed_seq_params"
_ROTARY_POS_EMB = "rotary_pos_emb"
_INFERENCE_ARGS = ("inference_context", "inference_params")
_FORWARD_SIGNATURE = inspect.signature(SelfAttention.forward)
# megatron-core's TransformerLayer passes hidden_states (and attention_mask) by position and
# every other argument by keyword: such a call is read without binding the signature.
_LEADING_POSITIONAL = 2
_PENDING_ROPE_ATTR = "_pending_packed_rope"
_FREQS_DIMS = 4  # RotaryEmbedding's table: [S, 1, 1, R]


def _one_table(rotary_pos_emb: Any) -> Optional[torch.Tensor]:
    """The frequency table when q and k use the same one (what the GPT and MTP pass)."""
    if isinstance(rotary_pos_emb, tuple):
        q_freqs, k_freqs = rotary_pos_emb
        return q_freqs if q_freqs is k_freqs else None
    return rotary_pos_emb


def call_arguments(module: Any, args: tuple, kwargs: dict,
                   signature: inspect.Signature | None = None) -> tuple[tuple, dict]:
    """``(positional, keywords)`` for ``SelfAttention.forward`` (or the forward whose
    ``signature`` is given: MLA's) that make the same call as ``module.forward(*args,
    **kwargs)``, with every argument the forward reads (``packed_seq_params``,
    ``rotary_pos_emb``, the inference ones) among the keywords, where it may be changed.
    Binding the signature took tens of microseconds per layer and micro-batch (the host's work
    every step), so a call of TransformerLayer's form keeps its keywords as they are; any other
    is bound, and then passed by keyword."""
    if len(args) <= _LEADING_POSITIONAL:
        return args, dict(kwargs)
    bound = (signature or _FORWARD_SIGNATURE).bind_partial(module, *args, **kwargs)
    keywords = dict(bound.arguments)
    del keywords["self"]
    return (), keywords


class CPSwitchingSelfAttention(SelfAttention):
    """``SelfAttention`` whose RoPE and core attention follow ``packed_seq_params.cp_group``.

    Same constructor and forward as megatron-core's ``SelfAttention`` (a spec swap, not an
    edit). When the micro-batch carries a CP group (or ``local_cp_size``), the call runs inside
    :meth:`use_cp_group`; otherwise on the static group. THD RoPE comes from one table per
    micro-batch where :meth:`_packed_rope_freqs` allows it (module docstring).
    """

    # False: megatron-core's own RoPE everywhere (the reference the equivalence tests run).
    rope_from_one_table: bool = True
    _pending_packed_rope: Optional[tuple[Any, torch.Tensor]] = None  # (params, freqs) of a call

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

    def _with_host_boundaries(self, arguments: dict) -> None:
        """For our core attentions: ``packed_seq_params`` swapped for its view with host
        boundaries (megatron-core's RoPE, where it runs, then reads nothing back)."""
        packed_seq_params = arguments.get(_PACKED_SEQ_PARAMS)
        if packed_seq_params is not None and isinstance(self.core_attention, VarlenCoreAttention):
            arguments[_PACKED_SEQ_PARAMS] = with_host_boundaries(packed_seq_params)

    def _packed_rope_freqs(self, arguments: dict) -> Optional[torch.Tensor]:
        """The frequency table when this call's RoPE comes from one table per micro-batch;
        None where megatron-core's own RoPE runs (see the module docstring for the list)."""
        params = arguments.get(_PACKED_SEQ_PARAMS)
        freqs = _one_table(arguments.get(_ROTARY_POS_EMB))
        config = self.config
        no_rope = bool(config.no_rope_freq) and config.no_rope_freq[self.layer_number - 1]
        supported = (
            self.rope_from_one_table and freqs is not None and not no_rope
            and params is not None and params.qkv_format == "thd"
            and isinstance(self.core_attention, VarlenCoreAttention)
            and all(arguments.get(name) is None for name in _INFERENCE_ARGS)
            and not config.apply_rope_fusion and not config.multi_latent_attention
            and config.mrope_section is None and not getattr(self, "offload_qkv_linear", False)
            and freqs.dim() == _FREQS_DIMS and freqs.shape[1:3] == (1, 1))
        return freqs if supported else None

    def get_query_key_value_tensors(self, hidden_states, key_value_states=None,
                                    output_gate=False, split_qkv=True):
        """The parent's q, k, v (, gate), with RoPE applied to q and k from the micro-batch's
        table when :meth:`forward` installed a request (the parent then skips its own)."""
        qkv = super().get_query_key_value_tensors(
            hidden_states, key_value_states, output_gate=output_gate, split_qkv=split_qkv)
        if self._pending_packed_rope is None:
            return qkv
        assert split_qkv, "THD attention always splits q, k and v (megatron-core 0.16.1)"
        params, freqs = self._pending_packed_rope
        query, key, *rest = qkv
        cp = self.pg_collection.cp  # the micro-batch's group (installed by forward)
        table = packed_rope_table(params, freqs, cp.size(), cp.rank(),
                                  _yarn_get_concentration_factor_from_config(self.config),
                                  query.dtype)
        interleaved = self.config.rotary_interleaved
        return (table.rotate(query, interleaved), table.rotate(key, interleaved), *rest)

    def forward(self, *args, **kwargs):
        """``SelfAttention.forward`` on the micro-batch's CP group (restored afterwards), with
        THD RoPE from the micro-batch's table where supported."""
        args, arguments = call_arguments(self, args, kwargs)
        self._with_host_boundaries(arguments)
        packed_seq_params = arguments.get(_PACKED_SEQ_PARAMS)
        freqs = self._packed_rope_freqs(arguments)
        pending = None
        if freqs is not None:
            arguments[_ROTARY_POS_EMB] = None  # the parent applies no RoPE of its own
            pending = (packed_seq_params, freqs)
        with swap_attributes([(self, _PENDING_ROPE_ATTR, pending)]):
            if not carries_cp_group(packed_seq_params):
                return super().forward(*args, **arguments)
            group = resolve_cp_group(packed_seq_params, self.pg_collection.cp)
            with self.use_cp_group(group):
                return super().forward(*args, **arguments)
