"""One global batch -> the packed THD micro-batches this rank runs (docs/ARCHITECTURE.md).

    packer = GlobalBatchPacker(config)
    step = packer.pack_global_batch(samples)   # StepBatches: micro-batches + global counts

    wrapper = HybridCPDataLoaderWrapper(data_iterator, config)   # Megatron-LM's seed API
    step = next(wrapper)

``data_iterator`` yields, per global batch, the list of samples THIS DP replica loaded
(dataset sample dicts). Per global batch: gather real lengths over DP (every sample gets a
global id: DP-rank-major order), run the pure scheduler (same answer on every rank), reroute
real tokens to the DP x CP ranks that run them, pack each micro-batch (THD), split it for its
CP group and build PackedSeqParams. Every TP rank and PP stage runs the same deterministic
steps, so all stages agree on num_microbatches and every micro-batch's metadata by construction;
:func:`_verify_model_parallel_agreement` checks that with one tiny all-reduce per step.
Samples are never modified.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from megatron.core import parallel_state
from megatron.varlen.packing import reroute, thd_microbatch
from megatron.varlen.platform.cpu_device import get_device
from megatron.varlen.scheduling.cost_model import CostModel
from megatron.varlen.scheduling.pipeline_order import order_for_pipeline
from megatron.varlen.scheduling.problem import Schedule, ScheduleProblem
from megatron.varlen.scheduling.registry import get_scheduler
from megatron.varlen.scheduling.schedule_evaluation import ScheduleCosts, schedule_costs

_FINGERPRINT_BYTES = 7  # fits an int64 all-reduce without overflow


@dataclass(frozen=True)
class PackingConfig:
    """What the packing path needs to know (built from the CLI by the training layer)."""

    scheduler: str                # dp_balanced | default | empty | default_dynamic_cp
    max_seqlen_per_rank: int      # --max-seqlen-per-dp-cp-rank: tokens per rank per micro-batch
    pad_id: int
    sp_factor: int = 1            # TP size with sequence parallel, else 1
    min_cp_size: int = 1          # --min-dynamic-context-parallel-size
    vpp_group_size: int = 1       # micro-batch count must be a multiple of this (VPP)
    min_num_microbatches: int = 1  # PP size: fewer micro-batches than stages wastes the pipeline
    pipeline_stages: int = 1      # PP size: micro-batches are ordered to shrink the bubbles
    # Pad every rank's share of every micro-batch to exactly this many tokens (a masked filler
    # sequence), so activations have one shape. Needed with VPP: megatron-core then exchanges
    # shapes over p2p, and at PP=2 (next stage == previous stage) gloo pairs shape and tensor
    # messages wrongly. None = variable shapes (fine without VPP).
    fixed_tokens_per_rank: int | None = None
    cost: CostModel = field(default_factory=CostModel)
    # Per-token fields beyond tokens/labels/loss_mask the caller's samples carry (e.g. a facade
    # flow's advantages): rerouted, packed and CP-split exactly like loss_mask, as float32.
    extra_token_fields: tuple[str, ...] = ()


@dataclass
class StepBatches:
    """The micro-batches one rank runs in one training step, and the step's global counts."""

    microbatches: list[dict]
    num_microbatches: int
    # Exact integers over the whole global batch, real (unpadded) lengths: FLOPs, tokens/s.
    seqlen_sum: int
    seqlen_squared_sum: int
    stats: dict = field(default_factory=dict)


@dataclass(frozen=True)
class PlannedBatch:
    """A global batch's problem, its schedule (in pipeline order) and the schedule's statistics
    for the step's log line."""

    problem: ScheduleProblem
    schedule: Schedule
    stats: dict


@dataclass
class ProcessGroups:
    """The groups the packing path talks over (megatron parallel_state by default)."""

    dp: object
    dp_cp: object
    cp: object
    model_parallel: object

    @classmethod
    def from_parallel_state(cls) -> "ProcessGroups":
        return cls(
            dp=parallel_state.get_data_parallel_group(),
            dp_cp=parallel_state.get_data_parallel_group(with_context_parallel=True),
            cp=parallel_state.get_context_parallel_group(),
            model_parallel=parallel_state.get_model_parallel_group(),
        )


@dataclass(frozen=True)
class GatheredLengths:
    """What the length gather learns about one global batch, passed on to schedule and reroute.

    ``lengths[i]`` is the real length of the sample with global id ``i`` (DP-rank-major order),
    ``owners[i]`` the DP replica that loaded it, ``first_id`` the global id of this replica's
    first sample.
    """

    lengths: tuple[int, ...]
    owners: tuple[int, ...]
    first_id: int


class GlobalBatchPacker:
    """The packing service: one global batch -> this rank's :class:`StepBatches`.

    Each method is one step of the data path; values flow from one to the next explicitly
    (gather -> :class:`GatheredLengths` -> schedule -> reroute -> pack).

    Args:
        config: :class:`PackingConfig`.
        pg_collection: :class:`ProcessGroups` (default: from megatron parallel_state).
        group_lookup: ``(ranks tuple) -> process group`` for CP groups other than the static
            one (dynamic CP); None allows only the static CP group and size 1.
    """

    def __init__(self, config: PackingConfig, pg_collection=None, group_lookup=None):
        self.config = config
        self.groups = pg_collection or ProcessGroups.from_parallel_state()
        self.group_lookup = group_lookup
        self.dp_size = dist.get_world_size(self.groups.dp)
        self.cp_size = dist.get_world_size(self.groups.cp)
        self.rank = dist.get_rank(self.groups.dp_cp)  # = dp_rank * cp + cp_rank
        self.device = get_device()

    def gather_lengths(self, samples: list[dict]) -> GatheredLengths:
        """Real lengths of the whole global batch and which replica holds each sample."""
        gathered = [None] * self.dp_size
        dist.all_gather_object(gathered, [int(s["length"]) for s in samples], group=self.groups.dp)
        dp_rank = dist.get_rank(self.groups.dp)
        return GatheredLengths(
            lengths=tuple(length for replica in gathered for length in replica),
            owners=tuple(d for d, replica in enumerate(gathered) for _ in replica),
            first_id=sum(len(replica) for replica in gathered[:dp_rank]),
        )

    def schedule(self, gathered: GatheredLengths):
        """(problem, schedule): the pure scheduler's answer (identical on every rank), with the
        micro-batches already in pipeline order."""
        planned = self.plan(gathered)
        return planned.problem, planned.schedule

    def plan(self, gathered: GatheredLengths) -> "PlannedBatch":
        """The schedule in pipeline order and its statistics, both from one evaluation of the
        schedule under the cost model, made when the schedule is."""
        cfg = self.config
        problem = ScheduleProblem(
            lengths=gathered.lengths, dp_size=self.dp_size, cp_size=self.cp_size,
            max_seqlen_per_rank=cfg.max_seqlen_per_rank, min_cp_size=cfg.min_cp_size,
            sp_factor=cfg.sp_factor, vpp_group_size=cfg.vpp_group_size,
            min_num_microbatches=cfg.min_num_microbatches, owners=gathered.owners,
            cost=cfg.cost,
        )
        schedule = get_scheduler(cfg.scheduler)(problem)
        costs = schedule_costs(problem, schedule)
        # Order only (contents unchanged): small micro-batches where the pipeline fills/drains.
        ordered = order_for_pipeline(schedule, problem, cfg.pipeline_stages, list(costs.levels))
        return PlannedBatch(problem, ordered, schedule_stats(problem, ordered, cfg, costs))

    def reroute(self, samples: list[dict], schedule, gathered: GatheredLengths) -> dict:
        """{global id: real tokens/labels/loss_mask (+ extra token fields)} for every sample
        this rank runs."""
        local = {gathered.first_id + i: sample for i, sample in enumerate(samples)}
        return reroute.reroute_samples(local, schedule.microbatches, gathered.owners,
                                       gathered.lengths, self.cp_size, self.groups.dp_cp,
                                       self.device, self.config.extra_token_fields)

    def pack_global_batch(self, samples: list[dict]) -> StepBatches:
        """The whole data path for one global batch (see the module docstring)."""
        gathered = self.gather_lengths(samples)
        planned = self.plan(gathered)
        schedule = planned.schedule
        mine = self.reroute(samples, schedule, gathered)
        microbatches = [self._microbatch_inputs(schedule, m, mine)
                        for m in range(schedule.num_microbatches())]
        _verify_model_parallel_agreement(schedule, self.groups.model_parallel)
        lengths = gathered.lengths
        return StepBatches(
            microbatches=microbatches, num_microbatches=schedule.num_microbatches(),
            seqlen_sum=sum(lengths), seqlen_squared_sum=sum(n * n for n in lengths),
            stats=dict(planned.stats),
        )

    def _microbatch_inputs(self, schedule, microbatch: int, mine: dict) -> dict:
        ids = schedule.microbatches[microbatch][self.rank]
        fixed = self.config.fixed_tokens_per_rank
        if not ids:
            pack = thd_microbatch.dummy_pack(self.config.pad_id, self.config.sp_factor, fixed,
                                             self.config.extra_token_fields)
            return thd_microbatch.build_model_inputs(pack, 0, None, self.device)
        group_ranks = schedule.group_ranks(microbatch, self.rank)
        pack = thd_microbatch.pack_sequences(
            [mine[sid] for sid in ids], [schedule.padded_lengths[sid] for sid in ids],
            local_cp_size=len(group_ranks), pad_id=self.config.pad_id, sample_ids=tuple(ids),
            total_tokens=fixed * len(group_ranks) if fixed else None,
            extra_fields=self.config.extra_token_fields)
        return thd_microbatch.build_model_inputs(
            pack, group_ranks.index(self.rank), self._process_group(group_ranks), self.device)

    def _process_group(self, group_ranks: tuple[int, ...]):
        if len(group_ranks) == 1:
            return None
        static_block = self.rank - self.rank % self.cp_size
        if group_ranks == tuple(range(static_block, static_block + self.cp_size)):
            return self.groups.cp
        assert self.group_lookup is not None, (
            f"schedule uses CP group {group_ranks} but only the static CP group of size "
            f"{self.cp_size} exists (dynamic CP groups were not created)")
        return self.group_lookup(group_ranks)


class HybridCPDataLoaderWrapper:
    """Megatron-LM's seed API: an iterator over packed global batches (a thin wrapper over
    :class:`GlobalBatchPacker`, which production code uses directly).

    The seed API's step methods take plain lengths, so ``schedule(lengths)`` and
    ``reroute_samples_to_hdp_ranks(..., lengths)`` use the owners of the gather that produced
    those lengths; this wrapper keeps that one gather and checks the lengths match it.
    """

    def __init__(self, data_iterator, config: PackingConfig, pg_collection=None,
                 group_lookup=None):
        self.data_iterator = data_iterator
        self.packer = GlobalBatchPacker(config, pg_collection, group_lookup)
        self.config = config
        self.rank = self.packer.rank
        self._gathered: GatheredLengths | None = None

    def __iter__(self):
        return self

    def __next__(self) -> StepBatches:
        return self.packer.pack_global_batch(next(self.data_iterator))

    def pack_global_batch(self, samples: list[dict]) -> StepBatches:
        return self.packer.pack_global_batch(samples)

    def get_global_seqlens(self, samples: list[dict]) -> list[int]:
        """Real lengths of the whole global batch, DP-rank-major (index = global id)."""
        return [length for _, length in self.get_global_id_seqlens(samples)]

    def get_global_id_seqlens(self, samples: list[dict]) -> list[tuple[int, int]]:
        """(global id, real length) for every sample of the global batch, in id order."""
        self._gathered = self.packer.gather_lengths(samples)
        return list(enumerate(self._gathered.lengths))

    def schedule(self, lengths: list[int]):
        """The pure scheduler's answer for these real lengths (identical on every rank)."""
        return self.packer.schedule(self._gathered_for(lengths))

    def reroute_samples_to_hdp_ranks(self, samples: list[dict], schedule, lengths) -> dict:
        """{global id: real tokens/labels/loss_mask} for every sample this rank runs
        (Megatron-LM's name; "hdp" = its hybrid data x context parallel ranks)."""
        return self.packer.reroute(samples, schedule, self._gathered_for(lengths))

    def _gathered_for(self, lengths) -> GatheredLengths:
        if self._gathered is None or tuple(lengths) != self._gathered.lengths:
            raise ValueError("schedule()/reroute_samples_to_hdp_ranks() need the lengths returned "
                             "by this wrapper's last get_global_seqlens() call")
        return self._gathered

    @staticmethod
    def unpack_batch(batch: dict) -> list[dict]:
        """A padded [b, s] batch with per-row ``length`` -> one real-length sample per row."""
        rows = batch["tokens"].shape[0]
        return [
            {key: batch[key][row, : int(batch["length"][row])].clone()
             for key in ("tokens", "labels", "loss_mask")} | {"length": int(batch["length"][row])}
            for row in range(rows)
        ]


def schedule_stats(problem, schedule, config: PackingConfig, costs: ScheduleCosts) -> dict:
    """Padding ratio and schedule imbalance (critical path / perfectly balanced time), from
    the schedule's ``costs`` (evaluated once, when the schedule was made)."""
    real = sum(problem.lengths)
    slots = sum(schedule.padded_lengths)
    idle = sum(1 for mb in schedule.microbatches for ids in mb if not ids)
    slots += idle * (config.fixed_tokens_per_rank
                     or thd_microbatch.DUMMY_SEQUENCE_TOKENS * config.sp_factor)
    mean_total = costs.busy_rank_time / problem.num_ranks
    return {
        "real_tokens": real,
        "padding_ratio": 1.0 - real / slots if slots else 0.0,
        "schedule_imbalance": costs.critical_path / mean_total if mean_total else 1.0,
    }


def _fingerprint(schedule) -> int:
    text = repr((schedule.microbatches, schedule.padded_lengths, schedule.cp_sizes))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:_FINGERPRINT_BYTES], "little")


def _verify_model_parallel_agreement(schedule, group) -> None:
    """All TP ranks and PP stages must run the same micro-batches: one all-reduce proves it."""
    if dist.get_world_size(group) == 1:
        return
    value = _fingerprint(schedule)
    extremes = torch.tensor([value, -value], dtype=torch.int64, device=get_device())  # NCCL
    dist.all_reduce(extremes, op=dist.ReduceOp.MAX, group=group)
    assert extremes[0] == value and -extremes[1] == value, (
        "TP/PP ranks computed different packing schedules for the same global batch "
        f"(fingerprint {value} vs max {int(extremes[0])}, min {-int(extremes[1])})")
