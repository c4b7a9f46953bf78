"""Multi-token prediction (MTP) on packed THD micro-batches and per-micro-batch CP groups.

megatron-core 0.16.1 runs MTP inside ``GPTModel._postprocess``: it rolls input ids, position
ids, labels and the loss mask one token left *within each sequence*, using
``packed_seq_params.cu_seqlens_q`` as offsets and each module's construction-time CP group. Two
things go wrong on our packs: (1) the offsets are REAL lengths but the stream is laid out with
PADDED lengths (a roll crosses into the next sequence whenever there is padding), and (2) under
dynamic CP the static group is the wrong group for the micro-batch.

:class:`VarlenGPTModel` fixes both without editing megatron-core: for ``_postprocess`` only, MTP
sees the padded boundaries as its sequence boundaries, and the model and its MTP modules use
the micro-batch's CP group (restored in a ``finally``). Using padded boundaries inside MTP is
exact for real tokens: padding sits at the end of each sequence and attention is causal, so no
real token ever sees a padding key, and the rolled loss mask keeps padding out of the loss.
"""

from __future__ import annotations

import dataclasses

from megatron.core.models.gpt import GPTModel
from megatron.varlen.attention.attention_plan import HOST_BOUNDARIES_ATTR, attach_host_boundaries
from megatron.varlen.attention.core_attention import VarlenCoreAttention
from megatron.varlen.attention.cp_group import resolve_cp_group, use_cp_group


def padded_boundaries(packed_seq_params, on_host: bool = False):
    """A copy whose real boundaries are the padded ones (what the MTP roll must walk).

    The copy carries the host copies of its boundaries when the original does (so the MTP
    layers' attention and RoPE read nothing back). With ``on_host`` its ``cu_seqlens_q``/``kv``
    ARE those host copies: megatron-core's roll slices with every boundary, which on device
    tensors is a device->host read per sequence. Only for our core attentions: TE's reads the
    fields on the device.
    """
    if packed_seq_params is None or packed_seq_params.cu_seqlens_q_padded is None:
        return packed_seq_params
    host = getattr(packed_seq_params, HOST_BOUNDARIES_ATTR, None)
    padded_q = packed_seq_params.cu_seqlens_q_padded
    padded_kv = packed_seq_params.cu_seqlens_kv_padded
    if on_host and host is not None:
        padded_q = padded_kv = host.cu_seqlens_padded
    copy = dataclasses.replace(packed_seq_params, cu_seqlens_q=padded_q, cu_seqlens_kv=padded_kv)
    if host is not None:
        attach_host_boundaries(copy, host.cu_seqlens_padded, host.cu_seqlens_padded)
    return copy


class VarlenGPTModel(GPTModel):
    """GPTModel whose MTP rolls stay inside each packed sequence on the micro-batch's CP group."""

    def _mtp_modules(self) -> list:
        modules = [self]
        if getattr(self, "mtp", None) is not None:
            modules += [self.mtp, *self.mtp.layers]
        return modules

    def _mtp_attention_is_ours(self) -> bool:
        """Whether every MTP layer's core attention is one of ours (not TE's)."""
        cores = [getattr(getattr(getattr(layer, "transformer_layer", None), "self_attention",
                                 None), "core_attention", None) for layer in self.mtp.layers]
        return all(isinstance(core, VarlenCoreAttention) for core in cores)

    def _postprocess(self, *args, packed_seq_params=None, **kwargs):
        if self.config.mtp_num_layers is None or packed_seq_params is None:
            return super()._postprocess(*args, packed_seq_params=packed_seq_params, **kwargs)
        group = resolve_cp_group(packed_seq_params, self.cp_group)
        with use_cp_group(self._mtp_modules(), group):
            return super()._postprocess(
                *args, packed_seq_params=padded_boundaries(
                    packed_seq_params, on_host=self._mtp_attention_is_ours()), **kwargs)
