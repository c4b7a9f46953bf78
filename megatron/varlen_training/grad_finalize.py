"""megatron-core's ``finalize_model_grads`` without its host read of the token count.

With ``--calculate-per-token-loss`` (always on with packing) megatron-core divides the gradients
by the global number of loss tokens at the end of ``finalize_model_grads``, behind
``if num_tokens > 0:`` -- a device->host read of a CUDA tensor on every step, which stalls the
host until the whole backward has run. :func:`finalize_model_grads_on_device` runs megatron-core's
function for everything else (DP reduction, sequence-parallel and embedding all-reduces, in the
same order) and then does the token division on the device: the same broadcast over the pipeline
group, the same all-reduce over DP x CP, and a scale by ``1 / max(num_tokens, 1)``: the same
factor when there are tokens, and a scale by 1 (gradients unchanged, like megatron-core's
skipped division) when there are none. The numbers are identical.
"""

from __future__ import annotations

import torch

from megatron.core import parallel_state
from megatron.core.distributed import finalize_model_grads
from megatron.core.pipeline_parallel.utils import get_pp_last_rank
from megatron.core.utils import get_attr_wrapped_model, get_model_config


def _pipeline_and_dp_cp_groups(pg_collection):
    if pg_collection is not None:
        return pg_collection.pp, pg_collection.dp_cp
    return (parallel_state.get_pipeline_model_parallel_group(),
            parallel_state.get_data_parallel_group(with_context_parallel=True))


def allreduce_mtp_position_embedding_grads(model) -> None:
    """Sums the learned position embeddings' gradients of the first stage and of the last
    stage's MTP copy over the embedding group (first and last pipeline stages), as
    megatron-core does for the word embeddings: megatron-core 0.16.1 reduces position
    embeddings only over its position-embedding group, the first stage alone, so with PP the
    two copies would each train on half the gradient and drift apart (the main model's
    positions would never learn from the MTP loss)."""
    if not get_model_config(model[0]).mtp_num_layers:
        return
    group = parallel_state.get_embedding_group(check_initialized=False)
    if group is None or group.size() == 1:
        return
    if torch.distributed.get_rank() not in torch.distributed.get_process_group_ranks(group):
        return
    first = parallel_state.is_pipeline_first_stage(ignore_virtual=True)
    embedding = get_attr_wrapped_model(model[0] if first else model[-1], "embedding")
    positions = getattr(embedding, "position_embeddings", None)
    if positions is not None:
        torch.distributed.all_reduce(positions.weight.main_grad, group=group)


def finalize_model_grads_on_device(model, num_tokens=None, pg_collection=None,
                                   force_all_reduce=False):
    """Drop-in for ``megatron.core.distributed.finalize_model_grads`` (the
    ``config.finalize_model_grads_func`` contract) that never reads a device value."""
    finalize_model_grads(model, None, pg_collection=pg_collection,
                         force_all_reduce=force_all_reduce)
    allreduce_mtp_position_embedding_grads(model)
    if num_tokens is None:
        return
    pp_group, dp_cp_group = _pipeline_and_dp_cp_groups(pg_collection)
    # Only the last pipeline stage counted the tokens: it tells the others.
    torch.distributed.broadcast(num_tokens, src=get_pp_last_rank(pp_group), group=pp_group)
    torch.distributed.all_reduce(num_tokens, group=dp_cp_group)
    scaling = 1.0 / num_tokens.clamp(min=1)
    for model_chunk in model:
        model_chunk.scale_gradients(scaling)
