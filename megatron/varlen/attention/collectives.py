"""A differentiable all-gather along dim 0 for context-parallel K/V exchange.

Forward: every rank contributes its [T_r, ...] shard, every rank receives the rank-ordered
concatenation [cp * T_r, ...]. Backward: rank r's gradient is the sum, over all ranks, of the
gradient slice that belongs to r's shard (every rank's queries attended to r's keys). That is a
reduce-scatter; gloo has no reduce-scatter, so there the sum is an all-reduce followed by a slice.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

_REDUCE_SCATTER_BACKENDS = ("nccl",)


class _AllGatherDim0(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        tensor = tensor.contiguous()
        shards = [torch.empty_like(tensor) for _ in range(group.size())]
        dist.all_gather(shards, tensor, group=group)
        return torch.cat(shards, dim=0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        group = ctx.group
        size, rank = group.size(), group.rank()
        grad = grad.contiguous()
        shard_len = grad.size(0) // size
        if dist.get_backend(group) in _REDUCE_SCATTER_BACKENDS:
            out = grad.new_empty((shard_len, *grad.shape[1:]))
            dist.reduce_scatter_tensor(out, grad, group=group)
            return out, None
        summed = grad.clone()
        dist.all_reduce(summed, group=group)
        return summed[rank * shard_len:(rank + 1) * shard_len], None


def all_gather_dim0(tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Differentiable all-gather of ``tensor`` [T_r, ...] over ``group`` -> [size * T_r, ...].

    The caller must skip this for a group of size 1 (no collective is wanted there).
    """
    assert group.size() > 1, "all_gather_dim0 called on a single-rank group"
    return _AllGatherDim0.apply(tensor, group)
