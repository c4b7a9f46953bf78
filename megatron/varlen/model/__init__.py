"""The model's varlen pieces: the layer specs (THD attention with per-micro-batch CP groups,
sequence-parallel norms), ``--spec`` loading, and the GPT model whose MTP rolls stay inside each
packed sequence. Names are imported on first use (:mod:`megatron.varlen.lazy_exports`): the
argument parser loads a ``--spec`` without importing the model."""

from megatron.varlen.lazy_exports import lazy_exports

_SPEC = "megatron.varlen.model.spec"
_SPEC_LOADING = "megatron.varlen.model.spec_loading"
_MOE_SPEC = "megatron.varlen.model.moe_spec"
_EXPORTS = {
    "VarlenGPTModel": "megatron.varlen.model.mtp", "VarlenNorm": "megatron.varlen.model.norms",
    "get_varlen_decoder_block_spec": _SPEC, "get_varlen_gpt_layer_spec": _SPEC,
    "get_varlen_mtp_block_spec": _SPEC,
    "check_takes_thd": _SPEC_LOADING, "load_layer_spec": _SPEC_LOADING,
    "check_has_qk_layernorm": _SPEC_LOADING, "is_default_spec": _SPEC_LOADING,
    "VarlenTopKRouter": "megatron.varlen.model.packed_router",
    "get_varlen_moe_block_spec": _MOE_SPEC, "with_moe_mlp": _MOE_SPEC,
    "moe_layer_pattern": "megatron.varlen.model.moe_layers", "RoutesMicroBatch": _MOE_SPEC,
    "moe_metrics": "megatron.varlen.model.moe_metrics",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
