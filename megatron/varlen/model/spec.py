"""Layer specs for variable-length training: megatron-core's GPT specs with two swaps.

Only ``self_attention.module`` (-> :class:`CPSwitchingSelfAttention`, or with multi-latent
attention :class:`VarlenMLASelfAttention`) and ``self_attention.submodules.core_attention``
(-> :class:`VarlenCoreAttention`, the flash backend's :class:`FlashVarlenCoreAttention`, or TE's
``TEDotProductAttention``) change; every other slot is exactly what megatron-core's own spec
function returns (its MLA spec under ``multi_latent_attention``). Loadable with Megatron's
``--spec megatron.varlen.model.spec get_varlen_gpt_layer_spec``.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_local_spec,
    get_gpt_layer_with_transformer_engine_spec,
    get_gpt_mtp_block_spec,
)
from megatron.core.transformer.attention import SelfAttention
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.multi_latent_attention import MLASelfAttention
from megatron.core.transformer.transformer_block import (
    TransformerBlockSubmodules, get_num_layers_to_build,
)
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_layer import TransformerLayer
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron.varlen.platform import accelerator
from megatron.varlen.attention.core_attention import VarlenCoreAttention
from megatron.varlen.attention.cp_switching import CPSwitchingSelfAttention
from megatron.varlen.attention.flash_attention import FlashVarlenCoreAttention
from megatron.varlen.attention.mla_attention import VarlenMLASelfAttention
from megatron.varlen.attention.te_adapter import get_te_core_attention
from megatron.varlen.model.norms import VarlenNorm

# Norm slots of a local-spec layer: megatron-core's torch norm there refuses sequence parallel.
_LAYER_NORM_SLOTS = ("input_layernorm", "pre_mlp_layernorm")
_ATTENTION_NORM_SLOTS = ("q_layernorm", "k_layernorm", "kv_layernorm")  # kv: MLA's latent norm
# megatron-core's attention class -> ours (the same constructor and forward).
_VARLEN_ATTENTION = {SelfAttention: CPSwitchingSelfAttention,
                     MLASelfAttention: VarlenMLASelfAttention}
_MTP_NORM_SLOTS = ("enorm", "hnorm", "layer_norm")


def _with_sp_capable_norms(layer_spec: ModuleSpec) -> ModuleSpec:
    """Local spec only: every torch norm becomes :class:`VarlenNorm` (SP-capable, plain torch)."""
    layer = layer_spec.submodules
    attention = layer.self_attention
    attention_norms = {slot: VarlenNorm for slot in _ATTENTION_NORM_SLOTS
                       if getattr(attention.submodules, slot, None) not in (None, IdentityOp)}
    attention = dataclasses.replace(
        attention, submodules=dataclasses.replace(attention.submodules, **attention_norms))
    layer_norms = {slot: VarlenNorm for slot in _LAYER_NORM_SLOTS
                   if getattr(layer, slot, None) not in (None, IdentityOp)}
    return dataclasses.replace(layer_spec, submodules=dataclasses.replace(
        layer, self_attention=attention, **layer_norms))


def _with_varlen_attention(layer_spec: ModuleSpec, core_attention: type) -> ModuleSpec:
    """A copy of ``layer_spec`` with the self-attention class and core attention swapped."""
    attention = layer_spec.submodules.self_attention
    assert attention.module in _VARLEN_ATTENTION, f"unexpected attention {attention.module}"
    switched = dataclasses.replace(
        attention,
        module=_VARLEN_ATTENTION[attention.module],
        submodules=dataclasses.replace(attention.submodules, core_attention=core_attention),
    )
    return dataclasses.replace(
        layer_spec, submodules=dataclasses.replace(layer_spec.submodules, self_attention=switched)
    )


def get_varlen_gpt_layer_spec(
    num_experts: Optional[int] = None,
    qk_layernorm: bool = False,
    normalization: Optional[str] = None,
    use_te: Optional[bool] = None,
    attention_backend: Optional[str] = None,
    multi_latent_attention: bool = False,
) -> ModuleSpec:
    """GPT decoder layer spec with THD/CP core attention and per-micro-batch CP switching.

    Args:
        num_experts: MoE experts (None for a dense MLP), passed to megatron-core's spec.
        qk_layernorm: layernorm on queries and keys.
        normalization: "LayerNorm" or "RMSNorm" for the local spec (the TE spec reads
            ``config.normalization`` at build time instead).
        use_te: None picks TE when it imports and CUDA is available; False forces the local
            (plain torch) spec; True requires TE. Ignored when ``attention_backend`` is given.
        attention_backend: "local", "flash", "te" or "auto" (TE if available, else flash on
            CUDA, else local; an fp32 run on CUDA must ask for "local": FlashAttention takes
            half precision). The training path passes the backend it resolved with
            :func:`megatron.varlen.platform.accelerator.resolve_attention_backend`.
        multi_latent_attention: megatron-core's MLA layer (``--multi-latent-attention``; the
            config must be an ``MLATransformerConfig``) instead of standard self-attention.

    Raises:
        ValueError: ``use_te=True`` or ``attention_backend="te"`` without Transformer Engine
            and CUDA.
    """
    mla = {"multi_latent_attention": multi_latent_attention}
    if attention_backend is not None:
        return _spec_for_backend(attention_backend, num_experts, qk_layernorm, normalization,
                                 multi_latent_attention)
    te_attention = get_te_core_attention() if use_te is not False else None
    if use_te and te_attention is None:
        raise ValueError(
            "use_te=True needs Transformer Engine and a CUDA device; pass use_te=None or False"
        )
    if te_attention is not None:
        base = get_gpt_layer_with_transformer_engine_spec(
            num_experts=num_experts, qk_layernorm=qk_layernorm, **mla
        )
        return _with_varlen_attention(base, te_attention)
    base = get_gpt_layer_local_spec(
        num_experts=num_experts, qk_layernorm=qk_layernorm, normalization=normalization, **mla
    )
    return _with_sp_capable_norms(_with_varlen_attention(base, VarlenCoreAttention))


def _spec_for_backend(backend, num_experts, qk_layernorm, normalization,
                      multi_latent_attention) -> ModuleSpec:
    if backend == accelerator.AUTO:
        backend = (accelerator.TE if accelerator.te_available() else
                   accelerator.FLASH if accelerator.flash_varlen_available() else accelerator.LOCAL)
    if backend == accelerator.TE:
        return get_varlen_gpt_layer_spec(num_experts, qk_layernorm, normalization, use_te=True,
                                         multi_latent_attention=multi_latent_attention)
    if backend not in (accelerator.FLASH, accelerator.LOCAL):
        raise ValueError(f"attention_backend {backend!r}: choose from "
                         f"{accelerator.ATTENTION_BACKENDS}")
    core = FlashVarlenCoreAttention if backend == accelerator.FLASH else VarlenCoreAttention
    base = get_gpt_layer_local_spec(
        num_experts=num_experts, qk_layernorm=qk_layernorm, normalization=normalization,
        multi_latent_attention=multi_latent_attention
    )
    return _with_sp_capable_norms(_with_varlen_attention(base, core))


def _is_plain_torch_attention(core_attention) -> bool:
    """Our reference or flash core attention (local spec), as opposed to TE's."""
    return isinstance(core_attention, type) and issubclass(core_attention, VarlenCoreAttention)


def get_varlen_decoder_block_spec(config: TransformerConfig, layer_spec: ModuleSpec,
                                  vp_stage: Optional[int] = None):
    """The decoder block for this pipeline stage: ``layer_spec`` layers + a final norm.

    With the local (plain torch) layer spec the final norm must be SP-capable too, which a bare
    layer spec cannot say (megatron-core then picks its torch norm): return a block spec with
    :class:`VarlenNorm`. A TE layer spec is returned unchanged (TE norms handle SP).
    """
    core_attention = layer_spec.submodules.self_attention.submodules.core_attention
    if not _is_plain_torch_attention(core_attention):
        return layer_spec
    num_layers = get_num_layers_to_build(config, vp_stage=vp_stage)
    return TransformerBlockSubmodules(layer_specs=[layer_spec] * num_layers,
                                      layer_norm=VarlenNorm)


def get_varlen_mtp_block_spec(
    config: TransformerConfig,
    layer_spec: ModuleSpec,
    vp_stage: Optional[int] = None,
    pp_rank: Optional[int] = None,
):
    """megatron-core's MTP block spec built around our layer spec (None without MTP layers).

    The MTP layers' transformer layer is ``layer_spec`` (so its attention switches CP groups);
    the rest (norms, ``eh_proj``) comes from the backend matching ``layer_spec``. Caveat: in
    megatron-core 0.16.1 the MTP token roll under THD reads the REAL ``cu_seqlens_q`` and the
    static ``cp_group`` of the MTP modules (see docs/ATTENTION.md).
    """
    core_attention = layer_spec.submodules.self_attention.submodules.core_attention
    uses_te = not _is_plain_torch_attention(core_attention)
    # megatron-core takes a bare layer spec only when its class IS TransformerLayer; a subclass
    # (the MoE layer that routes per micro-batch) goes in as a one-layer block.
    spec = (layer_spec if layer_spec.module is TransformerLayer
            else TransformerBlockSubmodules(layer_specs=[layer_spec]))
    block = get_gpt_mtp_block_spec(
        config, spec, use_transformer_engine=uses_te, vp_stage=vp_stage, pp_rank=pp_rank
    )
    if block is None or uses_te:
        return block
    # The local backend's norms refuse sequence parallelism; the MTP layers' norms see the same
    # sequence-parallel hidden states as the decoder's, so they get the decoder's VarlenNorm.
    # (megatron-core 0.16.1 returns the block's submodules, MultiTokenPredictionBlockSubmodules.)
    layers = [dataclasses.replace(layer, submodules=dataclasses.replace(
        layer.submodules, **{slot: VarlenNorm for slot in _MTP_NORM_SLOTS}))
        for layer in block.layer_specs]
    return dataclasses.replace(block, layer_specs=layers)
