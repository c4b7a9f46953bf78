"""Mamba-2 for variable-length training: kernel twins, the mixer with CP switching, hybrid specs.

Names are imported on first use (:mod:`megatron.varlen.lazy_exports`): importing the model or
the spec installs the Triton stand-in megatron-core's Mamba modules need where Triton is missing
(see triton_stand_in.py), which a GPT run that only initialises weights must not pay for.
"""

from megatron.varlen.lazy_exports import lazy_exports

_EXPORTS = {
    "VarlenMambaModel": "megatron.varlen.mamba.model",
    "get_varlen_hybrid_stack_spec": "megatron.varlen.mamba.spec",
    "mamba_parameter_shard": "megatron.varlen.mamba.init",
    "triton_stand_in": "megatron.varlen.mamba.triton_stand_in",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
