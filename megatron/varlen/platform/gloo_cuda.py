"""Gradient reduction for CUDA ranks that talk over gloo (ranks sharing one GPU).

megatron-core's DDP (``distributed/param_and_grad_buffer.py``) wraps the per-bucket gradient
all-reduce (or reduce-scatter, and the distributed optimizer's parameter all-gather) in torch's
``_coalescing_manager``, which turns them into ONE ``ProcessGroup.allreduce_coalesced`` call.
gloo implements the coalesced collectives for CPU tensors only ("unsupported device type
cuda"), so CUDA ranks over gloo -- several ranks sharing one GPU, as the GPU tests do -- fail at
their first optimizer step.

For exactly that case (a gloo group while this process trains on CUDA), :func:`install` swaps
the manager megatron-core's DDP uses for :func:`grad_reduce_coalescing`, which lets each
bucket's collective run on its own: the same sums, one call per bucket instead of one per bucket
group. Every other case -- CPU ranks over gloo, NCCL groups (real multi-GPU runs, where NCCL
coalesces the buckets as upstream does) -- keeps torch's manager unchanged.
"""

from __future__ import annotations

import contextlib

import torch.distributed as dist

from megatron.varlen.platform import cpu_device

_GLOO = "gloo"


class _EachCollectiveOnItsOwn:
    """What the manager yields when nothing is coalesced: the collectives already ran."""

    def wait(self) -> None:
        """Nothing to wait for: every collective inside the block was synchronous."""


def runs_uncoalesced(group) -> bool:
    """True when ``group`` is gloo and this process trains on CUDA (gloo cannot coalesce)."""
    return not cpu_device.use_cpu() and dist.get_backend(group) == _GLOO


def _torch_coalescing_manager():
    return dist._coalescing_manager  # noqa: SLF001 -- the manager megatron-core itself uses


@contextlib.contextmanager
def grad_reduce_coalescing(group=None, device=None, async_ops: bool = False):
    """Drop-in for ``torch.distributed._coalescing_manager`` in megatron-core's DDP.

    Raises:
        RuntimeError: asynchronous collectives asked for on CUDA over gloo
            (``--overlap-grad-reduce``/``--overlap-param-gather``, megatron-core's
            ``overlap_grad_reduce``/``overlap_param_gather``): their handles could not be waited
            on. CPU ranks over gloo and NCCL groups overlap.
    """
    if not runs_uncoalesced(group):
        with _torch_coalescing_manager()(group, device=device, async_ops=async_ops) as manager:
            yield manager
        return
    if async_ops:
        raise RuntimeError("overlapped gradient reduction is not supported for CUDA ranks over "
                           "gloo (each bucket's collective runs synchronously); use NCCL")
    yield _EachCollectiveOnItsOwn()


def install() -> None:
    """Makes megatron-core's DDP use :func:`grad_reduce_coalescing` (idempotent)."""
    from megatron.core.distributed import param_and_grad_buffer

    param_and_grad_buffer._coalescing_manager = grad_reduce_coalescing  # noqa: SLF001
