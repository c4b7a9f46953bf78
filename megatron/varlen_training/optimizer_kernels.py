"""The optimizer step without the host round trips megatron-core makes when neither Apex nor
Transformer Engine is installed (the usual case for this repository).

megatron-core 0.16.1 then falls back to ``megatron.core.utils``' local stand-ins for Apex's
multi-tensor kernels, and to torch's AdamW with its default implementation:

* ``local_multi_tensor_l2_norm`` builds ``torch.tensor(list of per-parameter norms)``: one
  device->host copy PER PARAMETER on CUDA (~100-150 synchronising copies per step) before the
  one it needs for the returned norm. :func:`device_l2_norm` keeps the whole norm on the device
  (``torch._foreach_norm`` + one vector norm); the single host read that remains is
  megatron-core's own ``total_norm.item()`` at the end of ``get_grad_norm_fp32`` (the optimizer
  returns the grad norm as a Python float and clips with it).
* ``local_multi_tensor_scale`` copies and scales main/model parameters one tensor at a time;
  :func:`foreach_scale` does the same arithmetic (``src * scale``, then a copy with the
  destination's dtype) with torch's multi-tensor ``_foreach`` kernels, bit for bit.
* torch's AdamW runs the ``foreach`` implementation; :func:`use_fused_adam` switches it to
  torch's ``fused`` CUDA kernel (one launch per parameter group and dtype).

:func:`install` replaces the stand-ins only when megatron-core actually uses them (with Apex or
TE present, their fused kernels stay).
"""

from __future__ import annotations

import torch

_ADAM_CLASSES = (torch.optim.Adam, torch.optim.AdamW)
# Devices whose parameters get torch's fused Adam kernel. CPU has one too (torch >= 2.4), but
# the CPU path keeps torch's default so that it stays the reference the GPU path is checked
# against; tests add "cpu" here to check on CPU that every path switches.
FUSED_ADAM_DEVICE_TYPES = ("cuda",)


def device_l2_norm(chunk_size, noop_flag, tensor_lists, per_tensor, *args):
    """Drop-in for ``amp_C.multi_tensor_l2norm``: (total L2 norm as a 1-element fp32 device
    tensor, per-tensor norms or None), with no host read."""
    del chunk_size, noop_flag, args  # the Apex signature; nothing to chunk or flag here
    norms = [norm.float() for norm in torch._foreach_norm(tensor_lists[0])]  # noqa: SLF001
    total = torch.linalg.vector_norm(torch.stack(norms)).reshape(1)
    return total, (torch.stack(norms) if per_tensor else None)


def foreach_scale(chunk_size, noop_flag, tensor_lists, scale):
    """Drop-in for ``amp_C.multi_tensor_scale``: ``dst = src * scale`` for each pair of
    ``tensor_lists = [sources, destinations]`` (the destination keeps its dtype)."""
    del chunk_size, noop_flag
    sources, destinations = tensor_lists
    scaled = torch._foreach_mul(sources, scale)  # noqa: SLF001
    torch._foreach_copy_(destinations, scaled)  # noqa: SLF001


def install() -> bool:
    """Uses :func:`device_l2_norm` / :func:`foreach_scale` in megatron-core's grad clipping and
    optimizer where it would use its local stand-ins; returns True if anything was replaced."""
    from megatron.core import utils
    from megatron.core.optimizer import clip_grads, optimizer

    replaced = False
    if clip_grads.l2_norm_impl is utils.local_multi_tensor_l2_norm:
        clip_grads.l2_norm_impl = device_l2_norm
        replaced = True
    for module in (clip_grads, optimizer):
        if module.multi_tensor_scale_impl is utils.local_multi_tensor_scale:
            module.multi_tensor_scale_impl = foreach_scale
            replaced = True
    return replaced


def chained_optimizers(megatron_optimizer) -> list:
    """The optimizers inside a megatron-core ChainedOptimizer (with expert parallelism the
    dense and the expert one), or the optimizer itself."""
    return list(getattr(megatron_optimizer, "chained_optimizers", [megatron_optimizer]))


def torch_adam_optimizers(megatron_optimizer):
    """The torch Adam/AdamW instances inside a megatron-core optimizer (chained or not)."""
    for opt in chained_optimizers(megatron_optimizer):
        inner = getattr(opt, "optimizer", None)
        if isinstance(inner, _ADAM_CLASSES):
            yield inner


def use_fused_adam(megatron_optimizer) -> int:
    """Switches every torch Adam/AdamW inside ``megatron_optimizer`` whose parameters all live
    on CUDA (:data:`FUSED_ADAM_DEVICE_TYPES`) to the fused kernel; returns how many were
    switched.

    Call it after building the optimizer and again after loading a checkpoint (a loaded param
    group brings the flags it was saved with). Existing per-parameter ``step`` counters move to
    the parameter's device, where the fused kernel reads them.
    """
    switched = 0
    for inner in torch_adam_optimizers(megatron_optimizer):
        params = [p for group in inner.param_groups for p in group["params"]]
        if not params or any(p.device.type not in FUSED_ADAM_DEVICE_TYPES for p in params):
            continue
        for group in inner.param_groups:
            group["fused"], group["foreach"] = True, False
        for param, state in inner.state.items():
            if "step" in state:
                state["step"] = torch.as_tensor(state["step"], dtype=torch.float32,
                                                device=param.device)
        switched += 1
    return switched
