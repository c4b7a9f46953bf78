"""MoE layers for variable-length training: megatron-core's ``MoELayer`` with plain-torch
experts, our router, and a layer that hands the router its micro-batch.

* experts: megatron-core's local ``SequentialMLP`` (no Transformer Engine, runs on CPU; the
  grouped GEMM needs TE or the grouped_gemm package, so it is not used);
* shared experts: megatron-core's ``SharedExpertMLP`` (``--moe-shared-expert-intermediate-size``);
* router: :class:`VarlenTopKRouter` (balancing losses per real sequence, on the micro-batch's
  CP group);
* MoE layer: megatron-core's ``MoELayer``, adopted by the layer as a
  :class:`~megatron.varlen.model.routed_moe_layer.VarlenMoELayer` (its ``--recompute-modules
  moe`` recomputation routes in its call's micro-batch);
* layer: :class:`VarlenMoETransformerLayer`, megatron-core's ``TransformerLayer`` that routes
  each call with the call's ``packed_seq_params`` (megatron-core 0.16.1 gives the MoE layer only
  a padding mask).

``--moe-layer-freq`` picks which decoder layers are MoE (:func:`moe_layer_pattern`).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import (
    TransformerBlockSubmodules, get_num_layers_to_build,
)
from megatron.core.transformer.transformer_layer import (
    TransformerLayer, get_transformer_layer_offset,
)

from megatron.varlen.model.moe_layers import moe_layer_pattern
from megatron.varlen.model.norms import VarlenNorm
from megatron.varlen.model.packed_router import VarlenTopKRouter
from megatron.varlen.model.routed_moe_layer import VarlenMoELayer


class RoutesMicroBatch:
    """Mixin for a layer whose ``mlp`` is an MoE layer with a :class:`VarlenTopKRouter`: the
    router sees the call's ``packed_seq_params`` (also when the layer is recomputed: the
    checkpointed call passes the same arguments).

    ``default_padding_mask`` is the padding mask of a caller that cannot pass one: megatron-core
    0.16.1's MTP block calls its layers without the model's padding mask, and so does its
    decoder block for the layers ``--recompute-method block`` does not recompute (set by
    :class:`~megatron.varlen.model.mtp.VarlenGPTModel` for the duration of a forward, so it is
    gone when backward recomputes an MTP layer: that recomputation, ``--recompute-method
    uniform`` with MTP and MoE unpacked, is refused in recompute_arguments.py; the decoder's
    recomputed layers get the mask as a checkpointed input).
    """

    default_padding_mask = None
    # k for the layer of MTP depth k: its input at position t is token t + k, so only the first
    # L - k positions of a sequence of L tokens hold real tokens (0: a decoder layer).
    mtp_depth = 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        VarlenMoELayer.adopt(self.mlp)

    def forward(self, *args, **kwargs):
        if kwargs.get("padding_mask") is None and self.default_padding_mask is not None:
            kwargs["padding_mask"] = self.default_padding_mask
        with self.mlp.router.micro_batch(kwargs.get("packed_seq_params"), shift=self.mtp_depth,
                                         padding_mask=kwargs.get("padding_mask")):
            return super().forward(*args, **kwargs)


class VarlenMoETransformerLayer(RoutesMicroBatch, TransformerLayer):
    """``TransformerLayer`` with an MoE MLP routed per micro-batch."""


def varlen_moe_module_spec() -> ModuleSpec:
    """megatron-core's local MoE spec (SequentialMLP experts) with :class:`VarlenTopKRouter`."""
    spec = get_moe_module_spec(use_te=False, num_experts=1, moe_grouped_gemm=False)
    return dataclasses.replace(spec, submodules=dataclasses.replace(
        spec.submodules, router=VarlenTopKRouter))


def with_moe_mlp(layer_spec: ModuleSpec, layer_class: type = VarlenMoETransformerLayer
                 ) -> ModuleSpec:
    """``layer_spec`` with its MLP replaced by :func:`varlen_moe_module_spec` (and a separate
    pre-MLP norm when the dense spec fused it into the MLP's first linear)."""
    layer = layer_spec.submodules
    norm = layer.pre_mlp_layernorm
    if norm in (None, IdentityOp):
        norm = VarlenNorm
    return dataclasses.replace(layer_spec, module=layer_class, submodules=dataclasses.replace(
        layer, mlp=varlen_moe_module_spec(), pre_mlp_layernorm=norm))


def get_varlen_moe_block_spec(config, dense_layer_spec: ModuleSpec,
                              vp_stage: Optional[int] = None) -> TransformerBlockSubmodules:
    """This pipeline stage's decoder block: MoE layers where ``--moe-layer-freq`` says, the
    dense spec elsewhere, and an SP-capable final norm."""
    pattern: Sequence[bool] = moe_layer_pattern(config.moe_layer_freq, config.num_layers)
    moe_spec = with_moe_mlp(dense_layer_spec)
    offset = get_transformer_layer_offset(config, vp_stage=vp_stage)
    count = get_num_layers_to_build(config, vp_stage=vp_stage)
    layers = [moe_spec if pattern[offset + index] else dense_layer_spec
              for index in range(count)]
    return TransformerBlockSubmodules(layer_specs=layers, layer_norm=VarlenNorm)
