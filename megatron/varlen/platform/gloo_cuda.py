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

Those synchronous collectives cannot overlap anything: ``--overlap-grad-reduce`` and
``--overlap-param-gather`` are refused at start-up in that case (:func:`overlap_refusal`, which
takes the device and backend as values so that CPU tests can ask it about CUDA), instead of
failing at the first gradient reduction.
"""

from __future__ import annotations

import contextlib

import torch.distributed as dist

from megatron.varlen.platform import cpu_device

_GLOO = "gloo"
_OVERLAP_FLAGS = ("--overlap-grad-reduce", "--overlap-param-gather")


class _EachCollectiveOnItsOwn:
    """What the manager yields when nothing is coalesced: the collectives already ran."""

    def wait(self) -> None:
        """Nothing to wait for: every collective inside the block was synchronous."""


def trains_on_cuda() -> bool:
    """Whether this process trains on CUDA tensors (not the CPU device layer)."""
    return not cpu_device.use_cpu()


def runs_uncoalesced(group) -> bool:
    """True when ``group`` is gloo and this process trains on CUDA (gloo cannot coalesce)."""
    return trains_on_cuda() and dist.get_backend(group) == _GLOO


def overlap_refusal(on_cuda: bool, backend: str, overlap_grad_reduce: bool,
                    overlap_param_gather: bool) -> str | None:
    """Why the overlap flags that are on cannot run on ``backend`` with CUDA tensors (or not),
    as a one-line message naming them; None when nothing stands in the way."""
    flags = [flag for flag, on in zip(_OVERLAP_FLAGS, (overlap_grad_reduce, overlap_param_gather))
             if on]
    if not flags or not on_cuda or backend != _GLOO:
        return None
    named = " and ".join(flags)
    return (f"{named} cannot run on CUDA ranks over gloo (ranks sharing a GPU): gloo reduces "
            f"CUDA gradients one bucket at a time, synchronously, so nothing overlaps; drop "
            f"{named}, or run one rank per GPU (NCCL)")


def overlap_refusal_here(overlap_grad_reduce: bool, overlap_param_gather: bool) -> str | None:
    """:func:`overlap_refusal` for this process: its device and its default group's backend
    (megatron-core's data-parallel groups share it)."""
    return overlap_refusal(trains_on_cuda(), dist.get_backend(), overlap_grad_reduce,
                           overlap_param_gather)


def _torch_coalescing_manager():
    return dist._coalescing_manager  # noqa: SLF001 -- the manager megatron-core itself uses


@contextlib.contextmanager
def grad_reduce_coalescing(group=None, device=None, async_ops: bool = False):
    """Drop-in for ``torch.distributed._coalescing_manager`` in megatron-core's DDP.

    Raises:
        RuntimeError: asynchronous collectives asked for on CUDA over gloo
            (``--overlap-grad-reduce``/``--overlap-param-gather``, megatron-core's
            ``overlap_grad_reduce``/``overlap_param_gather``): their handles could not be waited
            on. Start-up refuses those flags first (:func:`overlap_refusal`); this guards
            callers that skip it. CPU ranks over gloo and NCCL groups overlap.
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
