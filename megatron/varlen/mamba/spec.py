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
  megatron-core's ``TENorm``;
* full activation recomputation: :class:`VarlenMambaStack` runs its layers through
  ``layer_recompute.py`` when ``recompute_granularity == "full"`` (megatron-core's stack has no
  recomputation; selective core-attention recomputation lives in the attention layers).
"""

from __future__ import annotations

import dataclasses

from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.identity_op import IdentityFuncOp, IdentityOp
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.utils import WrappedTensor, make_viewless_tensor

from megatron.varlen.mamba import triton_stand_in

triton_stand_in.install()  # before megatron.core.ssm (see triton_stand_in.py)

from megatron.core.ssm.mamba_block import MambaStack, MambaStackSubmodules  # noqa: E402
from megatron.core.ssm.mamba_layer import MambaLayer, MambaLayerSubmodules  # noqa: E402
from megatron.core.ssm.mlp_layer import MLPLayer  # noqa: E402
from megatron.varlen.mamba.layer_recompute import FULL, checkpointed_forward  # noqa: E402
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

    def forward(self, hidden_states, attention_mask, inference_context=None, rotary_pos_emb=None,
                *, inference_params=None, packed_seq_params=None, padding_mask=None):
        """megatron-core's forward, or in training with ``recompute_granularity == "full"`` the
        same layers under full recomputation (``layer_recompute.py``; megatron-core's stack has
        none)."""
        recompute = (self.training and self.config.recompute_granularity == FULL
                     and inference_context is None and inference_params is None)
        if not recompute:
            return super().forward(hidden_states, attention_mask, inference_context,
                                   rotary_pos_emb, inference_params=inference_params,
                                   packed_seq_params=packed_seq_params, padding_mask=padding_mask)
        if not self.pre_process:
            hidden_states = self.input_tensor  # set_input_tensor: the previous stage's output
        if isinstance(hidden_states, WrappedTensor):
            hidden_states = hidden_states.unwrap()
        hidden_states = checkpointed_forward(self.layers, self.config, hidden_states,
                                             attention_mask, rotary_pos_emb, packed_seq_params,
                                             padding_mask)
        if self.post_process and self.post_layer_norm:
            hidden_states = self.final_norm(hidden_states)
        # The pipeline schedule frees a stage's output in place: it must not be a view.
        return make_viewless_tensor(inp=hidden_states, requires_grad=hidden_states.requires_grad,
                                    keep_graph=True)


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
