"""The hybrid (Mamba + attention + MLP) stack spec, plain torch, with per-micro-batch CP switching.

megatron-core's ``mamba_stack_spec`` needs Transformer Engine (fused norm + linear layers, TE
attention, ``TENorm`` final norm). This spec has the same structure with local modules:

* ``M``: ``MambaLayer`` with :class:`VarlenNorm` in front of :class:`VarlenMambaMixer`
  (ColumnParallel in-projection, RowParallel out-projection) -- the norm is not fused into the
  in-projection, the same arithmetic;
* ``*``: the attention half of this fork's GPT layer spec (``CPSwitchingSelfAttention`` with
  THD/CP core attention, ``VarlenNorm``), MLP slots empty;
* ``-``: the MLP half of that spec in megatron-core's ``MLPLayer``;
* ``E``: the same with megatron-core's ``MoELayer`` as the MLP (plain-torch experts, our router:
  see ``megatron/varlen/model/moe_spec.py``);
* final norm: :class:`VarlenMambaStack` builds a ``VarlenNorm`` (SP-capable) instead of
  megatron-core's ``TENorm``.
"""

from __future__ import annotations

import dataclasses

from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.identity_op import IdentityFuncOp, IdentityOp
from megatron.core.transformer.spec_utils import ModuleSpec

from megatron.varlen.mamba import triton_stand_in

triton_stand_in.install()  # before megatron.core.ssm (see triton_stand_in.py)

from megatron.core.ssm.mamba_block import MambaStack, MambaStackSubmodules  # noqa: E402
from megatron.core.ssm.mamba_layer import MambaLayer, MambaLayerSubmodules  # noqa: E402
from megatron.core.ssm.mlp_layer import MLPLayer  # noqa: E402
from megatron.varlen.mamba.mixer import MambaMixerSubmodules, VarlenMambaMixer  # noqa: E402
from megatron.varlen.model.norms import VarlenNorm  # noqa: E402
from megatron.varlen.model.spec import get_varlen_gpt_layer_spec  # noqa: E402
from megatron.varlen.model.moe_spec import RoutesMicroBatch, with_moe_mlp  # noqa: E402


class VarlenMambaStack(MambaStack):
    """``MambaStack`` whose final norm is :class:`VarlenNorm` (megatron-core hard-codes TENorm)."""

    def __init__(self, config, submodules, *args, post_layer_norm: bool = True, **kwargs):
        super().__init__(config, submodules, *args, post_layer_norm=False, **kwargs)
        self.post_layer_norm = post_layer_norm
        if self.post_process and post_layer_norm:
            self.final_norm = VarlenNorm(config, config.hidden_size,
                                         eps=config.layernorm_epsilon)


def _mamba_layer_spec() -> ModuleSpec:
    mixer = ModuleSpec(module=VarlenMambaMixer, submodules=MambaMixerSubmodules(
        in_proj=ColumnParallelLinear, out_proj=RowParallelLinear))
    return ModuleSpec(module=MambaLayer, submodules=MambaLayerSubmodules(
        norm=VarlenNorm, mixer=mixer, mamba_bda=get_bias_dropout_add))


def _attention_only(layer: ModuleSpec) -> ModuleSpec:
    return dataclasses.replace(layer, submodules=dataclasses.replace(
        layer.submodules, pre_mlp_layernorm=IdentityOp, mlp=IdentityOp, mlp_bda=IdentityFuncOp))


def _mlp_only(layer: ModuleSpec) -> ModuleSpec:
    return dataclasses.replace(layer, module=MLPLayer, submodules=dataclasses.replace(
        layer.submodules, input_layernorm=IdentityOp, self_attention=IdentityOp,
        self_attn_bda=IdentityFuncOp))


class VarlenMoEMLPLayer(RoutesMicroBatch, MLPLayer):
    """``E``: megatron-core's ``MLPLayer`` with an MoE MLP routed per micro-batch."""


def get_varlen_hybrid_stack_spec() -> ModuleSpec:
    """The hybrid stack spec (plain torch; CPU and GPU); ``E`` layers are MoE-only layers
    (built only when the pattern has them, which needs experts in the config)."""
    layer = get_varlen_gpt_layer_spec(use_te=False)
    return ModuleSpec(module=VarlenMambaStack, submodules=MambaStackSubmodules(
        mamba_layer=_mamba_layer_spec(),
        attention_layer=_attention_only(layer),
        mlp_layer=_mlp_only(layer),
        moe_layer=with_moe_mlp(_mlp_only(layer), layer_class=VarlenMoEMLPLayer),
    ))
