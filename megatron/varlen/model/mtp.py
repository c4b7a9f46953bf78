"""Multi-token prediction (MTP) on packed THD micro-batches and per-micro-batch CP groups.

megatron-core 0.16.1 runs MTP inside ``GPTModel._postprocess``: it rolls input ids, position
ids, labels and the loss mask one token left *within each sequence*, using
``packed_seq_params.cu_seqlens_q`` as offsets and each module's construction-time CP group. Two
things go wrong on our packs: (1) the offsets are REAL lengths but the stream is laid out with
PADDED lengths (a roll crosses into the next sequence whenever there is padding), and (2) under
dynamic CP the static group is the wrong group for the micro-batch.

:class:`VarlenGPTModel` fixes both without editing megatron-core: for ``_postprocess`` only, MTP
sees the padded boundaries as its sequence boundaries, and the model and its MTP modules use
the micro-batch's CP group (restored in a ``finally``); without CP its rolls are one operation
per tensor instead of a loop over the sequences (:mod:`~megatron.varlen.model.mtp_roll`).
Using padded boundaries inside MTP is exact for real tokens: padding sits at the end of each
sequence and attention is causal, so no real token ever sees a padding key, and the rolled loss
mask keeps padding out of the loss.
"""

from __future__ import annotations

import torch

from megatron.core.models.gpt import GPTModel
from megatron.varlen.attention.core_attention import VarlenCoreAttention
from megatron.varlen.attention.cp_group import resolve_cp_group, use_cp_group
from megatron.varlen.model.moe_spec import RoutesMicroBatch
from megatron.varlen.model.mtp_metrics import recording_mtp_losses
from megatron.varlen.model.mtp_roll import rolling_within_sequences
from megatron.varlen.packing.packed_seq import with_padded_as_real


# The first element of a ShardedTensor's replica id says which pipeline stage's copy it is
# (megatron-core marks the last stage's tied word embeddings so, too).
_COPY_OF_FIRST_STAGE = 1


def _shifted_padding(padding_mask, depth: int):
    """[b, s] True where position t + ``depth`` is padding or past the end."""
    shifted = torch.ones_like(padding_mask, dtype=torch.bool)
    shifted[:, : padding_mask.shape[1] - depth] = padding_mask[:, depth:]
    return shifted


class VarlenGPTModel(GPTModel):
    """GPTModel whose MTP rolls stay inside each packed sequence on the micro-batch's CP group
    (and whose MTP MoE layers see the model's padding mask, which megatron-core does not pass)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for depth, layer in enumerate(self._mtp_moe_layers(), start=1):
            layer.mtp_depth = depth
        self._mark_mtp_position_embedding_shared()
        self._drop_unused_mtp_output_weight()

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata=None):
        """megatron-core's, with the last stage's MTP copy of the learned position embeddings
        saved as a replica of the first stage's (both hold the same values: see
        :meth:`_mark_mtp_position_embedding_shared`); as two main replicas of one key every
        save was refused ("Invalid access pattern")."""
        state = super().sharded_state_dict(prefix, sharded_offsets, metadata)
        positions = state.get(f"{prefix}embedding.position_embeddings.weight")
        if self.mtp_process and not self.pre_process and positions is not None:
            positions.replica_id = (_COPY_OF_FIRST_STAGE, *positions.replica_id[1:])
        return state

    def _drop_unused_mtp_output_weight(self) -> None:
        """With PP and tied embeddings, the last stage's MTP keeps a copy of the word embeddings
        and its output layer uses that copy; megatron-core 0.16.1 allocates the output layer's
        own weight there anyway (it skips the allocation on the first stage only). The stray
        weight never trains, and its checkpoint entry trips megatron-core's own check ("output
        layer will not have any weight" on an MTP stage): every save failed. Removed, as
        megatron-core removes it on the first stage."""
        if (self.mtp_process and self.post_process and not self.pre_process
                and self.share_embeddings_and_output_weights):
            self.output_layer.weight = None

    def _mark_mtp_position_embedding_shared(self) -> None:
        """With PP, the last stage's MTP keeps its own copy of the learned position embeddings
        (megatron-core shares only the word embeddings between the stages): it is a duplicate,
        like the word embedding copy, so the grad norm counts it once. Its gradient is summed
        with the first stage's (grad_finalize.py), so both copies take the same update."""
        positions = getattr(getattr(self, "embedding", None), "position_embeddings", None)
        if self.mtp_process and not self.pre_process and positions is not None:
            positions.weight.shared = True

    def _mtp_moe_layers(self) -> list:
        """The MTP layers with MoE MLPs routed per micro-batch, by depth."""
        mtp = getattr(self, "mtp", None)  # megatron-core sets it only with MTP layers
        return [layer.transformer_layer for layer in getattr(mtp, "layers", None) or []
                if isinstance(layer.transformer_layer, RoutesMicroBatch)]

    def _decoder_moe_layers(self) -> list:
        """This stage's decoder layers with MoE MLPs routed per micro-batch."""
        return [layer for layer in getattr(getattr(self, "decoder", None), "layers", None) or []
                if isinstance(layer, RoutesMicroBatch)]

    def _default_padding_masks(self, padding_mask) -> dict:
        """MoE layer -> the padding mask it uses when its caller passes none.

        The MTP MoE layers get the model's mask with the last ``depth`` positions of each
        sample marked (their rolled input is no token): megatron-core's MTP block passes none.
        The decoder's MoE layers get the model's mask itself: megatron-core 0.16.1's
        ``--recompute-method block`` calls the layers it does not recompute without it (their
        routers balanced over padding: grad norm 1.3x off by iteration 3)."""
        masks = {layer: _shifted_padding(padding_mask, layer.mtp_depth)
                 for layer in self._mtp_moe_layers()}
        masks.update({layer: padding_mask for layer in self._decoder_moe_layers()})
        return masks

    def forward(self, *args, padding_mask=None, **kwargs):
        """``padding_mask`` ([b, s], unpacked batches): also each MoE layer's default for the
        duration of the forward (:meth:`_default_padding_masks`). A packed micro-batch's
        routers find padding, and MTP's dropped positions, through their sequence map (from the
        pack's routed lengths), so they need no default."""
        unpacked = kwargs.get("packed_seq_params") is None
        masks = self._default_padding_masks(padding_mask) \
            if padding_mask is not None and unpacked else {}
        for layer, mask in masks.items():
            layer.default_padding_mask = mask
        try:
            return super().forward(*args, padding_mask=padding_mask, **kwargs)
        finally:
            for layer in masks:
                layer.default_padding_mask = None

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
        # With PP only the last stage holds the MTP block: the others just hand on hidden states.
        if not self.mtp_process:
            return super()._postprocess(*args, packed_seq_params=packed_seq_params, **kwargs)
        if packed_seq_params is None:  # the MTP losses' sums and counts for the iteration's report
            with recording_mtp_losses():
                return super()._postprocess(*args, packed_seq_params=None, **kwargs)
        group = resolve_cp_group(packed_seq_params, self.cp_group)
        with use_cp_group(self._mtp_modules(), group), rolling_within_sequences(), \
                recording_mtp_losses():
            # The copy carries host boundaries of its own (so the MTP layers' attention and
            # RoPE read nothing back); with our attentions its cu_seqlens ARE those host copies:
            # megatron-core's roll slices at every boundary, a device->host read per sequence on
            # device tensors. TE's attention reads the fields on the device.
            return super()._postprocess(
                *args, packed_seq_params=with_padded_as_real(
                    packed_seq_params, on_host_fields=self._mtp_attention_is_ours()), **kwargs)
