"""One global batch -> this rank's packed micro-batches, through the training path's packer.

The facade does what ``pretrain_gpt.py`` does (``PackedBatchProvider``): DP replica r takes
block r of the global batch (:func:`megatron.training.data.replica_block`) and
``GlobalBatchPacker.pack_global_batch`` schedules, reroutes, packs (THD) and CP-splits
it. The only addition is the flow's extra fields: the packer moves ``tokens``, ``labels`` and
``loss_mask``; every other per-token field is laid out like ``loss_mask`` (each sequence
padded to its packed length, filler and idle packs 0) and CP-split with the same function,
from the copy of the global batch every rank holds. Global sample id == index in the batch,
because replica blocks are contiguous and the packer numbers samples DP-rank-major.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from megatron.core import parallel_state
from megatron.training.data import replica_block
from megatron.varlen.cp_split import split_thd_for_cp
from megatron.varlen.data_schedule import StepBatches
from megatron.wrap.flows.base import PER_SAMPLE


def pack_step(packer, samples: list[dict], extra_fields: dict) -> StepBatches:
    """This rank's micro-batches of the global batch ``samples`` (checked data-path samples).

    Args:
        packer: The run's ``GlobalBatchPacker``.
        samples: The whole global batch, identical on every rank.
        extra_fields: ``Flow.extra_fields()``: field -> 0 (per token) or None (per sample).
    """
    mine = replica_block(samples, parallel_state.get_data_parallel_world_size(),
                         parallel_state.get_data_parallel_rank())
    step = packer.pack_global_batch(list(mine))
    for micro_batch in step.microbatches:
        for field, dim in extra_fields.items():
            micro_batch[field] = (_per_sample(micro_batch, samples, field) if dim is PER_SAMPLE
                                  else _per_token(micro_batch, samples, field))
    return step


def _per_sample(micro_batch: dict, samples: list[dict], field: str) -> torch.Tensor:
    """``[n]``: the field of each sequence of the pack, in pack order."""
    values = [samples[sid][field] for sid in micro_batch["sample_ids"]]
    return torch.tensor(values, dtype=torch.float32, device=micro_batch["tokens"].device)


def _per_token(micro_batch: dict, samples: list[dict], field: str) -> torch.Tensor:
    """``[1, T_r]``: the field laid out like ``loss_mask`` and split for this CP rank."""
    params = micro_batch["packed_seq_params"]
    cu_padded = params.cu_seqlens_q_padded.cpu()
    stream = torch.zeros(int(cu_padded[-1]), dtype=torch.float32)  # T: the whole pack
    for position, sid in enumerate(micro_batch["sample_ids"]):
        values = samples[sid][field]
        start = int(cu_padded[position])
        stream[start: start + values.numel()] = values
    size = params.local_cp_size or 1
    if size > 1:
        stream = split_thd_for_cp(stream, cu_padded, size, dist.get_rank(params.cp_group),
                                  seq_dim=0)
    return stream.unsqueeze(0).to(micro_batch["tokens"].device)
