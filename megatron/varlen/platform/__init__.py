"""What this process runs on: the CPU device layer (megatron-core's CUDA-minded code on CPU/gloo),
the attention backend and fusions the accelerator allows, gradient reduction for CUDA ranks over
gloo, and the process groups of dynamic context parallelism.

``cpu_device`` and ``gloo_cuda`` are exported as modules: they hold process state
(``cpu_device.force_cpu()``/``activate()``, ``gloo_cuda.install()``). Names are imported on first
use (:mod:`megatron.varlen.lazy_exports`).
"""

from megatron.varlen.lazy_exports import lazy_exports

_ACCELERATOR = "megatron.varlen.platform.accelerator"
_CPU_DEVICE = "megatron.varlen.platform.cpu_device"
_GROUPS = "megatron.varlen.platform.dynamic_cp_groups"
_EXPORTS = {
    "ATTENTION_BACKENDS": _ACCELERATOR, "AUTO": _ACCELERATOR, "LOCAL": _ACCELERATOR,
    "TE": _ACCELERATOR, "TE_KERNELS": _ACCELERATOR,
    "describe_attention_backend": _ACCELERATOR, "resolve_attention_backend": _ACCELERATOR,
    "torch_varlen_attn": _ACCELERATOR, "use_bias_dropout_add_fusion": _ACCELERATOR,
    "cpu_device": _CPU_DEVICE, "get_device": _CPU_DEVICE, "use_cpu": _CPU_DEVICE,
    "gloo_cuda": "megatron.varlen.platform.gloo_cuda",
    "DynamicCPGroups": _GROUPS, "destroy_dynamic_cp_groups": _GROUPS,
    "initialize_dynamic_cp_groups": _GROUPS,
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
