"""One global batch -> this rank's packed micro-batches, through the training path's packer.

The facade does what ``pretrain_gpt.py`` does (``PackedBatchProvider``): DP replica r takes
block r of the global batch (:func:`megatron.varlen_training.data.replica_block`) and
``GlobalBatchPacker.pack_global_batch`` schedules, reroutes, packs (THD) and CP-splits it. The
flow's extra per-token fields are declared to the packer (``PackingConfig.extra_token_fields``),
which carries them exactly like ``loss_mask``. Per-sample fields are looked up by sample id:
global sample id == index in the batch, because replica blocks are contiguous and the packer
numbers samples DP-rank-major.
"""

from __future__ import annotations

import torch

from megatron.core import parallel_state
from megatron.varlen_training.data import replica_block
from megatron.varlen.packing import StepBatches
from megatron.wrap.flows.base import PER_SAMPLE


def per_token_fields(extra_fields: dict) -> tuple[str, ...]:
    """The per-token fields of ``Flow.extra_fields()`` (field -> 0 per token, None per sample)."""
    return tuple(name for name, dim in extra_fields.items() if dim is not PER_SAMPLE)


def pack_step(packer, samples: list[dict], extra_fields: dict) -> StepBatches:
    """This rank's micro-batches of the global batch ``samples`` (checked data-path samples).

    Args:
        packer: The run's ``GlobalBatchPacker`` (built with the flow's per-token fields).
        samples: The whole global batch, identical on every rank.
        extra_fields: ``Flow.extra_fields()``: field -> 0 (per token) or None (per sample).
    """
    mine = replica_block(samples, parallel_state.get_data_parallel_world_size(),
                         parallel_state.get_data_parallel_rank())
    step = packer.pack_global_batch(list(mine))
    per_sample = [name for name, dim in extra_fields.items() if dim is PER_SAMPLE]
    for micro_batch in step.microbatches:
        for name in per_sample:
            micro_batch[name] = _per_sample(micro_batch, samples, name)
    return step


def _per_sample(micro_batch: dict, samples: list[dict], field: str) -> torch.Tensor:
    """``[n]``: the field of each sequence of the pack, in pack order."""
    values = [samples[sid][field] for sid in micro_batch["sample_ids"]]
    return torch.tensor(values, dtype=torch.float32, device=micro_batch["tokens"].device)
