"""``--log-params-norm`` (Megatron-LM's flag): the L2 norm of all the model's weights, whatever
the layout.

Each rank holds a shard of the weights (TP, PP), replicated over data-parallel x context-parallel
ranks. Every rank sums the squares of the weights it holds once in the model -- not a TP rank's
copy of a weight every TP rank holds (layer norms, biases: megatron-core's
``param_is_not_tensor_parallel_duplicate``), not the last stage's copy of the word embeddings
(``param_is_not_shared``) -- in float64, divides by its DP x CP replication and one SUM
all-reduce over the world adds the shards up. Mixture-of-Experts weights are replicated and
sharded in other groups; their norm is not implemented (refused at start-up).
"""

from __future__ import annotations

import math

import torch

from megatron.core import parallel_state
from megatron.core.tensor_parallel.layers import param_is_not_tensor_parallel_duplicate
from megatron.core.transformer.module import param_is_not_shared
from megatron.varlen.platform import get_device


def _held_once(param: torch.Tensor) -> bool:
    return param_is_not_shared(param) and param_is_not_tensor_parallel_duplicate(param)


@torch.no_grad()
def params_l2_norm(model_chunks) -> float:
    """The L2 norm of the whole model's weights; the same on every rank (a collective: every
    rank must call it)."""
    squares = torch.zeros(1, dtype=torch.float64, device=get_device())
    for chunk in model_chunks:
        for param in chunk.parameters():
            if _held_once(param):
                squares += param.detach().double().square().sum()
    replicas = parallel_state.get_data_parallel_world_size(with_context_parallel=True)
    squares /= replicas
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(squares)
    return math.sqrt(squares.item())
