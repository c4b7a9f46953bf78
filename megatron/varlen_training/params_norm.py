"""``--log-params-norm`` (Megatron-LM's flag): the L2 norm of all the model's weights, whatever
the layout, Mixture-of-Experts models included.

Each rank holds a shard of the weights. Every rank sums, in float64, the squares of the weights
it holds once in the model: not a TP rank's copy of a weight every TP rank holds (layer norms,
biases, the router: megatron-core's ``param_is_not_tensor_parallel_duplicate``), not the last
stage's copy of the word embeddings (``param_is_not_shared``). As Megatron-LM's
``calc_params_l2_norm`` does, the two kinds of weights are then added up over the ranks that
hold their different shards:

- dense weights over the model-parallel group (TP x PP): its ranks hold disjoint shards, and
  every data-parallel x context-parallel replica of the group holds the same ones;
- expert weights of expert-parallel runs (megatron-core marks them ``allreduce = False``; with
  one expert-parallel rank they are dense weights) over the expert-tensor x expert x pipeline
  group: every rank of it holds other experts or another expert-TP shard, and the expert
  data-parallel replicas of the group hold the same ones. An expert weight that every
  expert-TP rank holds whole is counted on expert-TP rank 0 only.

Every rank ends with the same norm. When the two groups are the same ranks the sums are added
first and reduced once.

Which values: under ``--bf16``, as Megatron-LM's ``calc_params_l2_norm``, the optimizer's fp32
main params (megatron-core hangs each on its model param as ``main_param``), not the bf16
weights rounded from them; with the distributed optimizer each data-parallel rank holds a shard
of them (``main_param_sharded``; None where it holds none), so those sums are first added up
over the ranks that hold the shards: the data-parallel x context-parallel group for dense
weights, the expert data-parallel group for expert weights (Megatron-LM adds both over the
first). fp32 runs read the weights (they are the main params); fp16 runs the fp16 weights, as
Megatron-LM does.
"""

from __future__ import annotations

import math

import torch

from megatron.core import parallel_state
from megatron.core.tensor_parallel.layers import param_is_not_tensor_parallel_duplicate
from megatron.core.transformer.module import param_is_not_shared
from megatron.varlen.platform import get_device


def is_expert_parallel(param: torch.Tensor) -> bool:
    """megatron-core's mark of an expert weight sharded over expert-parallel ranks (the optimizer
    groups and the gradient reduction use the same attribute)."""
    return not getattr(param, "allreduce", True)


def _held_once(param: torch.Tensor, expert_tp_group) -> bool:
    if is_expert_parallel(param):
        return param_is_not_tensor_parallel_duplicate(param, tp_group=expert_tp_group)
    return param_is_not_shared(param) and param_is_not_tensor_parallel_duplicate(param)


def _norm_values(param: torch.Tensor, main_params: bool) -> tuple[torch.Tensor | None, bool]:
    """(the values counted for ``param``, whether they are a data-parallel shard): its fp32
    main param when ``main_params`` and the optimizer keeps one, else the weight itself."""
    if main_params and hasattr(param, "main_param"):
        return param.main_param, getattr(param, "main_param_sharded", False)
    return param, False


def _local_squares(model_chunks, expert_tp_group, main_params: bool) -> torch.Tensor:
    """Sums of the squares this rank counts, float64: [dense, expert, dense shards, expert
    shards] (the shards: of distributed-optimizer main params)."""
    sums = torch.zeros(4, dtype=torch.float64, device=get_device())
    for chunk in model_chunks:
        for param in chunk.parameters():
            if not _held_once(param, expert_tp_group):
                continue
            values, sharded = _norm_values(param, main_params)
            if values is not None:  # a sharded main param this rank holds no part of: None
                sums[int(is_expert_parallel(param)) + 2 * int(sharded)] += \
                    values.detach().double().square().sum()
    return sums


def _add_up_shards(sums: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dense, expert) with each data-parallel rank's shards of the main params added up over
    the group that shards them."""
    dense_shards, expert_shards = sums[2:3].clone(), sums[3:4].clone()
    torch.distributed.all_reduce(
        dense_shards, group=parallel_state.get_data_parallel_group(with_context_parallel=True))
    torch.distributed.all_reduce(expert_shards,
                                 group=parallel_state.get_expert_data_parallel_group())
    return sums[0:1] + dense_shards, sums[1:2] + expert_shards


def _same_ranks(first, second) -> bool:
    return (torch.distributed.get_process_group_ranks(first)
            == torch.distributed.get_process_group_ranks(second))


@torch.no_grad()
def params_l2_norm(model_chunks, main_params: bool = False) -> float:
    """The L2 norm of the whole model's weights; the same on every rank (a collective: every
    rank must call it). ``main_params`` (``--bf16``): the optimizer's fp32 main params where it
    keeps them (module docstring)."""
    if not torch.distributed.is_initialized():
        return math.sqrt(_local_squares(model_chunks, None, main_params).sum().item())
    sums = _local_squares(model_chunks, parallel_state.get_expert_tensor_parallel_group(),
                          main_params)
    if main_params:  # every rank joins (its shards may be empty), as the norm's reductions
        dense, expert = _add_up_shards(sums)
    else:
        dense, expert = sums[0:1].clone(), sums[1:2].clone()
    dense_group = parallel_state.get_model_parallel_group()
    expert_group = parallel_state.get_expert_tensor_model_pipeline_parallel_group()
    # Every rank joins both reductions, with or without expert weights of its own (a stage
    # without MoE layers holds none): a rank that skipped one would hang the others.
    if _same_ranks(dense_group, expert_group):
        dense += expert
        torch.distributed.all_reduce(dense, group=dense_group)
    else:
        torch.distributed.all_reduce(dense, group=dense_group)
        torch.distributed.all_reduce(expert, group=expert_group)
        dense += expert
    return math.sqrt(dense.item())
