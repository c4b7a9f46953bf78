"""Global-batch sampling and the unpacked (padded [b, s]) micro-batch path.

Sample ``i`` of the dataset is read by index, so every rank that needs a micro-batch (all TP
ranks and PP stages of one DP replica) reads the same samples deterministically. The packed
path (:class:`PackedBatchProvider` over :mod:`megatron.varlen.packing.data_schedule`) returns the same
``StepBatches``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from megatron.core import parallel_state
from megatron.varlen_training.config import RunConfig
from megatron.varlen_training.datasets import collate_padded
from megatron.varlen_training.moe_flops import linear_cost_scale
from megatron.varlen.packing import (
    GlobalBatchPacker, PackingConfig, StepBatches, host_to_device, split_sbhd_for_cp,
)
from megatron.varlen.platform import get_device
from megatron.varlen.scheduling import CostModel

_SEQ_DIM = 1  # batches are [b, s]


def global_batch_indices(iteration: int, global_batch_size: int) -> range:
    """Dataset indices of global batch ``iteration`` (0-based), in order."""
    start = iteration * global_batch_size
    return range(start, start + global_batch_size)


def dp_microbatch_indices(indices: range, micro_batch_size: int, dp_size: int, dp_rank: int):
    """Megatron's split: each chunk of mbs*dp samples gives DP rank r its slice r."""
    step = micro_batch_size * dp_size
    return [
        list(indices[start + dp_rank * micro_batch_size: start + (dp_rank + 1) * micro_batch_size])
        for start in range(0, len(indices), step)
    ]


def _slice_for_context_parallel(batch: dict) -> dict:
    cp_size = parallel_state.get_context_parallel_world_size()
    if cp_size == 1:
        return batch
    cp_rank = parallel_state.get_context_parallel_rank()
    return {key: split_sbhd_for_cp(value, cp_size, cp_rank, seq_dim=_SEQ_DIM)
            for key, value in batch.items()}


def _to_device(batch: dict) -> dict:
    device = get_device()  # pinned, asynchronous copies on CUDA: the host does not wait
    return {key: host_to_device(value, device) for key, value in batch.items()}


def _with_padding_mask(samples: list[dict]) -> dict:
    """The collated [b, s] batch plus ``padding_mask`` ([b, s] bool, True on the padding after
    each sample): megatron-core's MoE routing argument, so routers count real tokens only."""
    batch = collate_padded(samples)
    lengths = torch.tensor([sample["length"] for sample in samples])
    positions = torch.arange(batch["tokens"].shape[1])
    batch["padding_mask"] = positions.unsqueeze(0) >= lengths.unsqueeze(1)
    return batch


class UnpackedBatchProvider:
    """Every sample padded to --seq-length, micro-batches of --micro-batch-size per DP rank."""

    def __init__(self, dataset, global_batch_size: int, micro_batch_size: int, seq_length: int):
        self.dataset = dataset
        self.global_batch_size = global_batch_size
        self.micro_batch_size = micro_batch_size
        self.seq_length = seq_length

    def step_batches(self, iteration: int) -> StepBatches:
        indices = global_batch_indices(iteration, self.global_batch_size)
        per_rank = dp_microbatch_indices(
            indices, self.micro_batch_size, parallel_state.get_data_parallel_world_size(),
            parallel_state.get_data_parallel_rank())
        samples = [[self.dataset[i] for i in mb] for mb in per_rank]
        microbatches = [_to_device(_slice_for_context_parallel(_with_padding_mask(mb)))
                        for mb in samples]
        seqlen_sum, seqlen_squared_sum = _global_length_sums(
            [sample["length"] for mb in samples for sample in mb])
        slots = len(indices) * self.seq_length
        return StepBatches(
            microbatches=microbatches,
            num_microbatches=len(microbatches),
            seqlen_sum=seqlen_sum,
            seqlen_squared_sum=seqlen_squared_sum,
            stats={"real_tokens": seqlen_sum, "padding_ratio": 1.0 - seqlen_sum / slots},
        )


def _global_length_sums(local_lengths: list[int]) -> tuple[int, int]:
    """Exact sum(L) and sum(L^2) over the global batch from each DP replica's own samples.

    int64 all-reduce over DP (CP ranks of a replica hold the same samples): exact, unlike the
    float32 sums upstream broadcasts, and no rank reads samples it does not train on.
    """
    sums = torch.tensor([sum(local_lengths), sum(n * n for n in local_lengths)],
                        dtype=torch.int64, device=get_device())
    torch.distributed.all_reduce(sums, group=parallel_state.get_data_parallel_group())
    return int(sums[0]), int(sums[1])


def replica_block(items: Sequence, dp_size: int, dp_rank: int) -> Sequence:
    """DP replica r's share of a global batch: its r-th contiguous block, in order.

    Used by the packed path (:class:`PackedBatchProvider`) and by ``megatron.wrap``, so the same
    samples give the same schedule either way. When ``dp_size`` does not divide the batch (a
    runtime batch of any size), the first ``len(items) % dp_size`` replicas take one more item;
    a replica may get none (the packing path gathers lengths over DP and handles that).
    """
    base, extra = divmod(len(items), dp_size)
    start = dp_rank * base + min(dp_rank, extra)
    return items[start: start + base + (1 if dp_rank < extra else 0)]


def _cost_model(run: RunConfig, attention_fraction: float | None) -> CostModel:
    """The scheduler's cost model of the run's model: the profile's coefficients, attention
    weighted by the quadratic layers' share, the linear term by MoE's activated experts."""
    cost = CostModel.for_model(run.model.hidden_size, run.packing.hardware_profile,
                               a=attention_fraction)
    scale = linear_cost_scale(run.model)
    return cost if scale == 1.0 else dataclasses.replace(cost, b=cost.b * scale)


def build_packing_config(run: RunConfig, pad_id: int, attention_fraction: float | None = None,
                         extra_token_fields: tuple[str, ...] = ()) -> PackingConfig:
    """The packing path's settings for a run; ``attention_fraction``: the share of layers that
    are quadratic (the model family's; None: all of them); ``extra_token_fields``: per-token
    fields packed like ``loss_mask`` (a facade flow's)."""
    packing, parallel = run.packing, run.parallel
    pp = parallel.pipeline_model_parallel_size
    budget = packing.max_seqlen_per_dp_cp_rank
    return PackingConfig(
        scheduler=packing.sequence_packing_scheduler,
        max_seqlen_per_rank=budget,
        pad_id=pad_id,
        sp_factor=parallel.sp_factor,
        min_cp_size=packing.min_dynamic_context_parallel_size,
        vpp_group_size=pp if parallel.virtual_pipeline_model_parallel_size else 1,
        min_num_microbatches=pp,
        pipeline_stages=pp,
        cost=_cost_model(run, attention_fraction),
        fixed_tokens_per_rank=None if packing.variable_seq_lengths else budget,
        extra_token_fields=tuple(extra_token_fields),
        validate_schedules=packing.validate_packing_schedules,
        pad_packed_seq_alignment=packing.pad_packed_seq_alignment,
        thd_max_packed_sequences=packing.thd_max_packed_sequences,
        thd_tail_padding_policy=packing.thd_tail_padding_policy,
    )


class PackedBatchProvider:
    """Variable-length samples packed into THD micro-batches by the varlen data path."""

    def __init__(self, dataset, global_batch_size: int, packer: GlobalBatchPacker):
        self.dataset = dataset
        self.global_batch_size = global_batch_size
        self.packer = packer

    def step_batches(self, iteration: int) -> StepBatches:
        indices = global_batch_indices(iteration, self.global_batch_size)
        mine = replica_block(indices, parallel_state.get_data_parallel_world_size(),
                             parallel_state.get_data_parallel_rank())
        return self.packer.pack_global_batch([self.dataset[i] for i in mine])
