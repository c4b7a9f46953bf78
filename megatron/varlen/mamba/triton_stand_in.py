"""Lets megatron-core's Mamba modules import on machines without Triton (CPU).

``megatron.core.ssm.mamba_mixer`` imports three Triton tensor ops at module level
(``megatron.core.inference.contexts.attention_context.triton.tensor_ops``:
``tensor_get_slice_after``, ``tensor_masked_update``, ``tensor_merge``), and that module does
``import triton`` first thing. The mixer only calls them in dynamic-batching INFERENCE, never in
training. Without Triton, :func:`install` registers a stand-in module under that name whose
three functions raise, so training imports and runs, and an inference call fails loudly
instead of silently. With Triton installed (GPU machines) it does nothing.

Call :func:`install` before importing anything from ``megatron.core.ssm``.
"""

from __future__ import annotations

import importlib.util
import sys
import types

TENSOR_OPS_MODULE = "megatron.core.inference.contexts.attention_context.triton.tensor_ops"
_INFERENCE_OPS = ("tensor_get_slice_after", "tensor_masked_update", "tensor_merge")


def _inference_only(name: str):
    def unavailable(*args, **kwargs):
        raise NotImplementedError(
            f"{name} is a Triton kernel of megatron-core's dynamic inference; Triton is not "
            f"installed here (training does not need it)")
    unavailable.__name__ = name
    return unavailable


def install() -> bool:
    """Registers the stand-in if Triton is missing; returns True when it did."""
    if importlib.util.find_spec("triton") is not None or TENSOR_OPS_MODULE in sys.modules:
        return False
    stand_in = types.ModuleType(TENSOR_OPS_MODULE, "Stand-in: Triton is not installed.")
    for name in _INFERENCE_OPS:
        setattr(stand_in, name, _inference_only(name))
    sys.modules[TENSOR_OPS_MODULE] = stand_in
    return True
