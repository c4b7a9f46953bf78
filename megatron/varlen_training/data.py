"""Global-batch sampling and the unpacked (padded [b, s]) micro-batch path.

Sample ``i`` of the dataset is read by index, so every rank that needs a micro-batch (all TP
ranks and PP stages of one DP replica) reads the same samples deterministically. The packed
path (:class:`PackedBatchProvider` over :mod:`megatron.varlen.packing.data_schedule`) returns the
same ``StepBatches``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence

import torch

from megatron.core import parallel_state
from megatron.varlen_training.batch_rampup import GlobalBatchSchedule
from megatron.varlen_training.config import RunConfig
from megatron.varlen_training.datasets import collate_padded
from megatron.varlen_training.datasets.sample_reader import SampleReader
from megatron.varlen_training.mla_flops import attention_cost_scale
from megatron.varlen_training.moe_flops import linear_cost_scale
from megatron.varlen_training.read_agreement import read_agreed
from megatron.varlen_training.window_layers import (
    counted_window, gpt_attention_layers, windowed_layer_count,
)
from megatron.varlen.packing import (
    GlobalBatchPacker, PackingConfig, StepBatches, host_to_device, split_sbhd_for_cp,
)
from megatron.varlen.platform import get_device
from megatron.varlen.scheduling import CostModel, length_sums

_SEQ_DIM = 1  # batches are [b, s]
# The dense per-sample mask of --reset-attention-mask is [b, 1, s, S]: its query rows (dim 2)
# are CP-split like the tokens, its key columns stay whole (K and V are all-gathered).
_MASK_KEY, _MASK_QUERY_DIM = "attention_mask", 2
SampleTransform = Callable[[dict], dict]


def global_batch_indices(iteration: int, global_batch_size: int,
                         num_samples: int | None = None) -> range:
    """Dataset indices of global batch ``iteration`` (0-based), in order; with
    ``num_samples``, none past it (a last, partial batch)."""
    start = iteration * global_batch_size
    stop = start + global_batch_size
    return range(start, stop if num_samples is None else min(stop, num_samples))


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
    return {key: split_sbhd_for_cp(value, cp_size, cp_rank,
                                   seq_dim=_MASK_QUERY_DIM if key == _MASK_KEY else _SEQ_DIM)
            for key, value in batch.items()}


def _to_device(batch: dict) -> dict:
    device = get_device()  # pinned, asynchronous copies on CUDA: the host does not wait
    return {key: host_to_device(value, device) for key, value in batch.items()}


def _read_step(read: Callable[[], list[dict]], agree: bool) -> list[dict]:
    """A step's reads: agreed by every rank (read_agreement.py) where a read can fail."""
    return read_agreed(read) if agree else read()


def _batch_schedule(global_batch_size: int, schedule: GlobalBatchSchedule | None
                    ) -> GlobalBatchSchedule:
    """``schedule`` (--rampup-batch-size), else every batch ``global_batch_size`` samples."""
    if schedule is not None:
        return schedule
    return GlobalBatchSchedule(global_batch_size, micro_batch_times_dp=global_batch_size)


def _sample_reader(dataset, schedule: GlobalBatchSchedule, indices_of, num_workers: int):
    return SampleReader(dataset, indices_of, schedule.iterations_within(len(dataset)),
                        num_workers)


def _with_padding_mask(samples: list[dict]) -> dict:
    """The collated [b, s] batch plus ``padding_mask`` ([b, s] bool, True on the padding after
    each sample): megatron-core's MoE routing argument, so routers count real tokens only."""
    batch = collate_padded(samples)
    lengths = torch.tensor([sample["length"] for sample in samples])
    positions = torch.arange(batch["tokens"].shape[1])
    batch["padding_mask"] = positions.unsqueeze(0) >= lengths.unsqueeze(1)
    return batch


class UnpackedBatchProvider:
    """Every sample padded to --seq-length, micro-batches of --micro-batch-size per DP rank;
    ``num_workers`` processes read ahead (--num-workers).

    ``transform``: applied to every sample read (Megatron-LM's document flags,
    ``datasets/documents.py``); ``attention_lengths``: ``(samples) -> lengths`` of what attends
    as one in one DP replica's samples, for FLOPs (default: the samples' real lengths; its
    documents when the documents of a sample do not attend to each other); ``attention_window``:
    --window-size's LEFT where layers attend through it (FLOPs' windowed sum), else None;
    ``agree_on_reads``: whether every
    rank agrees on each step's reads (``read_agreement.reads_can_fail`` of the data; the same
    on every rank); ``schedule``: each iteration's global batch (--rampup-batch-size; default
    ``global_batch_size`` samples each).
    """

    def __init__(self, dataset, global_batch_size: int, micro_batch_size: int, seq_length: int,
                 num_workers: int = 0, transform: SampleTransform | None = None,
                 attention_lengths: Callable[[list[dict]], list[int]] | None = None,
                 agree_on_reads: bool = True, schedule: GlobalBatchSchedule | None = None,
                 attention_window: int | None = None):
        self.dataset = dataset
        self.agree_on_reads = agree_on_reads
        self.global_batch_size = global_batch_size
        self.schedule = _batch_schedule(global_batch_size, schedule)
        self.micro_batch_size = micro_batch_size
        self.seq_length = seq_length
        self.reader = _sample_reader(dataset, self.schedule, self._my_indices, num_workers)
        self.transform = transform
        self.attention_lengths = attention_lengths or _real_lengths
        self.attention_window = attention_window

    def _my_microbatches(self, iteration: int) -> list[list[int]]:
        return dp_microbatch_indices(
            self.schedule.indices(iteration), self.micro_batch_size,
            parallel_state.get_data_parallel_world_size(), parallel_state.get_data_parallel_rank())

    def _my_indices(self, iteration: int) -> list[int]:
        return [i for mb in self._my_microbatches(iteration) for i in mb]

    def close(self) -> None:
        """Stops the reader's worker processes (the run is over)."""
        self.reader.close()

    def _read(self, iteration: int) -> list[dict]:
        samples = self.reader.read(iteration)
        return samples if self.transform is None else [self.transform(s) for s in samples]

    def step_batches(self, iteration: int) -> StepBatches:
        indices = self.schedule.indices(iteration)
        # A sample that fails to read on one rank stops every rank (read_agreement.py).
        read = iter(_read_step(functools.partial(self._read, iteration), self.agree_on_reads))
        samples = [[next(read) for _ in mb] for mb in self._my_microbatches(iteration)]
        microbatches = [_to_device(_slice_for_context_parallel(_with_padding_mask(mb)))
                        for mb in samples]
        seqlen_sum, seqlen_squared_sum, windowed_sum = _global_length_sums(
            self.attention_lengths([sample for mb in samples for sample in mb]),
            self.attention_window)
        slots = len(indices) * self.seq_length
        return StepBatches(
            microbatches=microbatches,
            num_microbatches=len(microbatches),
            seqlen_sum=seqlen_sum,
            seqlen_squared_sum=seqlen_squared_sum,
            stats={"real_tokens": seqlen_sum, "padding_ratio": 1.0 - seqlen_sum / slots},
            seqlen_windowed_squared_sum=windowed_sum,
        )


def _real_lengths(samples: list[dict]) -> list[int]:
    return [sample["length"] for sample in samples]


def _global_length_sums(local_lengths: list[int], window: int | None
                        ) -> tuple[int, int, int | None]:
    """Exact sum(L), sum(L^2) and, with a window, the windowed sum (attention_area.py) over the
    global batch from each DP replica's own lengths.

    int64 all-reduce over DP (CP ranks of a replica hold the same samples): exact, unlike the
    float32 sums upstream broadcasts, and no rank reads samples it does not train on.
    """
    local = [value for value in length_sums(local_lengths, window) if value is not None]
    sums = torch.tensor(local, dtype=torch.int64, device=get_device())
    torch.distributed.all_reduce(sums, group=parallel_state.get_data_parallel_group())
    return int(sums[0]), int(sums[1]), None if window is None else int(sums[2])


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


def _cost_model(run: RunConfig, attention_layers: Sequence[int] | None = None) -> CostModel:
    """The scheduler's cost model of the run's model: the profile's coefficients, attention
    weighted by the attention layers' share of the layers (the share of them --window-size
    windows priced on the window's squared tokens: a_window), the linear term by MoE's
    activated experts."""
    model = run.model
    layers = gpt_attention_layers(model) if attention_layers is None else attention_layers
    # MLA's core attention is wider or narrower than a standard layer's (mla_flops.py)
    quadratic = len(layers) / model.num_layers * attention_cost_scale(model)
    windowed = windowed_layer_count(model, layers) / len(layers) if layers else 0.0
    cost = CostModel.for_model(model.hidden_size, run.packing.hardware_profile,
                               a=quadratic * (1.0 - windowed))
    if windowed:
        cost = dataclasses.replace(cost, a_window=quadratic * windowed,
                                   window=counted_window(model))
    scale = linear_cost_scale(model)
    return cost if scale == 1.0 else dataclasses.replace(cost, b=cost.b * scale)


def _keeps_microbatch_order(run: RunConfig) -> bool:
    """Whether the micro-batches must run in the scheduler's order, not reordered to shrink
    the pipeline's bubbles (which would make the trained model depend on the PP size)."""
    moe = run.model.moe
    return moe is not None and moe.depends_on_microbatch_order


def build_packing_config(run: RunConfig, pad_id: int,
                         attention_layers: Sequence[int] | None = None,
                         extra_token_fields: tuple[str, ...] = ()) -> PackingConfig:
    """The packing path's settings for a run; ``attention_layers``: the 1-based numbers of the
    layers whose cost is quadratic (the model family's; None: every decoder layer), their
    share weighting attention in the cost model and those a sliding window windows priced on
    its work; ``extra_token_fields``: per-token fields packed like ``loss_mask`` (a facade
    flow's)."""
    packing, parallel = run.packing, run.parallel
    pp = parallel.pipeline_model_parallel_size
    budget = packing.max_seqlen_per_dp_cp_rank
    return PackingConfig(
        scheduler=packing.sequence_packing_scheduler,
        max_seqlen_per_rank=budget,
        pad_id=pad_id,
        sp_factor=parallel.sp_factor,
        min_cp_size=packing.min_dynamic_context_parallel_size,
        # the interleaved schedule runs micro-batches in groups (megatron-core's default: PP)
        vpp_group_size=(parallel.microbatch_group_size_per_vp_stage or pp
                        if parallel.virtual_pipeline_model_parallel_size else 1),
        min_num_microbatches=pp,
        pipeline_stages=1 if _keeps_microbatch_order(run) else pp,
        cost=_cost_model(run, attention_layers),
        fixed_tokens_per_rank=None if packing.variable_seq_lengths else budget,
        extra_token_fields=tuple(extra_token_fields),
        validate_schedules=packing.validate_packing_schedules,
        pad_packed_seq_alignment=packing.pad_packed_seq_alignment,
        thd_max_packed_sequences=packing.thd_max_packed_sequences,
        thd_tail_padding_policy=packing.thd_tail_padding_policy,
        attention_window=counted_window(run.model),
    )


class PackedBatchProvider:
    """Variable-length samples packed into THD micro-batches by the varlen data path;
    ``num_workers`` processes read ahead (--num-workers).

    ``split``: turns every sample read into the sequences that are packed (pretraining data
    with --reset-attention-mask: its document pieces, ``datasets/documents.py``); None packs
    each sample whole. ``agree_on_reads``, ``schedule``: as :class:`UnpackedBatchProvider`'s (a
    smaller global batch simply packs fewer samples). ``whole_split``: the dataset is read to
    its end, its last global batch partial (--full-validation; :meth:`num_batches`); else every
    batch is whole.
    """

    def __init__(self, dataset, global_batch_size: int, packer: GlobalBatchPacker,
                 num_workers: int = 0, split: Callable[[dict], list[dict]] | None = None,
                 agree_on_reads: bool = True, schedule: GlobalBatchSchedule | None = None,
                 whole_split: bool = False):
        self.dataset = dataset
        self.whole_split = whole_split
        self.agree_on_reads = agree_on_reads
        self.global_batch_size = global_batch_size
        self.schedule = _batch_schedule(global_batch_size, schedule)
        self.packer = packer
        self.split = split
        self.reader = _sample_reader(dataset, self.schedule, self._my_indices, num_workers)

    def num_batches(self) -> int:
        """Global batches of one pass over the dataset, the last one partial."""
        return -(-len(self.dataset) // self.global_batch_size)

    def _my_indices(self, iteration: int) -> Sequence[int]:
        indices = (global_batch_indices(iteration, self.global_batch_size, len(self.dataset))
                   if self.whole_split else self.schedule.indices(iteration))
        return replica_block(indices,
                             parallel_state.get_data_parallel_world_size(),
                             parallel_state.get_data_parallel_rank())

    def close(self) -> None:
        """Stops the reader's worker processes (the run is over)."""
        self.reader.close()

    def _read(self, iteration: int) -> list[dict]:
        samples = self.reader.read(iteration)
        if self.split is None:
            return samples
        return [piece for sample in samples for piece in self.split(sample)]

    def step_batches(self, iteration: int) -> StepBatches:
        # A sample that fails to read on one rank stops every rank (read_agreement.py).
        return self.packer.pack_global_batch(
            _read_step(functools.partial(self._read, iteration), self.agree_on_reads))
