"""One global batch -> the packed THD micro-batches this rank runs (docs/ARCHITECTURE.md).

    packer = GlobalBatchPacker(config)
    step = packer.pack_global_batch(samples)   # StepBatches: micro-batches + global counts

    wrapper = HybridCPDataLoaderWrapper(data_iterator, config)   # Megatron-LM's seed API
    samples_by_id, sample_id_groups = next(wrapper)

``samples`` is the list of samples THIS DP replica loaded (dataset sample dicts; the seed API's
iterator yields packed samples instead, see its class). Per global batch: gather real lengths over
DP (every sample gets a global id: DP-rank-major order), run the pure scheduler (same answer on
every rank), reroute real tokens to the DP x CP ranks that run them, pack each micro-batch (THD),
split it for its CP group and build PackedSeqParams. Every TP rank and PP stage runs the same
deterministic steps, so all stages agree on num_microbatches and every micro-batch's metadata by
construction; :func:`_verify_model_parallel_agreement` checks that with one tiny all-reduce per
step. Samples are never modified.
"""

from __future__ import annotations

import bisect
import hashlib
from dataclasses import dataclass, field, fields

import torch
import torch.distributed as dist

from megatron.core import parallel_state
from megatron.varlen.packing import reroute, thd_microbatch
from megatron.varlen.packing.schedule_check import check_schedule
from megatron.varlen.packing.sequence_cap import cap_sequences_per_rank
from megatron.varlen.packing.thd_shapes import ALIGN_TO_BUDGET, APPEND_DUMMY_SEQ, ThdShape
from megatron.varlen.platform.cpu_device import get_device
from megatron.varlen.scheduling.attention_area import length_sums
from megatron.varlen.scheduling.cost_model import CostModel
from megatron.varlen.scheduling.pipeline_order import order_for_pipeline
from megatron.varlen.scheduling.problem import Schedule, ScheduleProblem
from megatron.varlen.scheduling.registry import DYNAMIC_CP, get_scheduler
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
    # --validate-packing-schedules: every schedule checked against all its invariants before it
    # runs (a debug aid; the suite checks the schedulers themselves offline).
    validate_schedules: bool = False
    # Megatron-LM's fixed THD shapes (thd_shapes.py), its field names: pad each rank's share of
    # a pack to the budget ("max") or to a multiple of N; at most K sequences per rank's pack
    # with K + 1 cu_seqlens entries; the padding tail as a dummy sequence or as padding of the
    # last one (None: append_dummy_seq).
    pad_packed_seq_alignment: int | str | None = None
    thd_max_packed_sequences: int | None = None
    thd_tail_padding_policy: str | None = None
    # --window-size's LEFT where some layer attends through the window: StepBatches then
    # carries the windowed length sum model FLOPs count (attention_area.py). None: no window.
    attention_window: int | None = None

    def __post_init__(self):
        self.thd_shape  # noqa: B018 - builds (so checks) the fixed-shape fields once, up front

    @property
    def thd_shape(self) -> ThdShape:
        """How every rank's pack is shaped (fixed p2p shapes with VPP count as ``max``)."""
        to_budget = self.pad_packed_seq_alignment == ALIGN_TO_BUDGET
        return ThdShape(
            alignment=None if to_budget else self.pad_packed_seq_alignment,
            tokens_per_rank=self.max_seqlen_per_rank if to_budget else self.fixed_tokens_per_rank,
            max_packed_sequences=self.thd_max_packed_sequences,
            tail_policy=self.thd_tail_padding_policy or APPEND_DUMMY_SEQ)


@dataclass
class StepBatches:
    """The micro-batches one rank runs in one training step, and the step's global counts."""

    microbatches: list[dict]
    num_microbatches: int
    # Exact integers over the whole global batch, real (unpadded) lengths: FLOPs, tokens/s.
    seqlen_sum: int
    seqlen_squared_sum: int
    stats: dict = field(default_factory=dict)
    # With a window: sum of m*(2L - m), m = min(L, LEFT + 1) (attention_area.py); else None.
    seqlen_windowed_squared_sum: int | None = None


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


def gather_lengths(local_lengths: list[int], dp_group) -> GatheredLengths:
    """Every replica's real lengths, in DP-rank order (one ``all_gather_object`` over DP)."""
    gathered = [None] * dist.get_world_size(dp_group)
    dist.all_gather_object(gathered, [int(n) for n in local_lengths], group=dp_group)
    dp_rank = dist.get_rank(dp_group)
    return GatheredLengths(
        lengths=tuple(length for replica in gathered for length in replica),
        owners=tuple(d for d, replica in enumerate(gathered) for _ in replica),
        first_id=sum(len(replica) for replica in gathered[:dp_rank]),
    )


def plan_batch(gathered: GatheredLengths, dp_size: int, cp_size: int,
               config: PackingConfig) -> PlannedBatch:
    """The schedule of one global batch in pipeline order and its statistics, both from one
    evaluation of the schedule under the cost model, made when the schedule is."""
    problem = ScheduleProblem(
        lengths=gathered.lengths, dp_size=dp_size, cp_size=cp_size,
        max_seqlen_per_rank=config.max_seqlen_per_rank, min_cp_size=config.min_cp_size,
        sp_factor=config.sp_factor, vpp_group_size=config.vpp_group_size,
        min_num_microbatches=config.min_num_microbatches, owners=gathered.owners,
        cost=config.cost,
    )
    schedule = cap_sequences_per_rank(get_scheduler(config.scheduler)(problem), problem,
                                      config.thd_shape.max_real_sequences())
    if config.validate_schedules:
        check_schedule(problem, schedule, config.scheduler)
    costs = schedule_costs(problem, schedule)
    # Order only (contents unchanged): small micro-batches where the pipeline fills/drains.
    ordered = order_for_pipeline(schedule, problem, config.pipeline_stages, list(costs.levels))
    return PlannedBatch(problem, ordered, schedule_stats(problem, ordered, config, costs))


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
        return gather_lengths([int(s["length"]) for s in samples], self.groups.dp)

    def schedule(self, gathered: GatheredLengths):
        """(problem, schedule): the pure scheduler's answer (identical on every rank), with the
        micro-batches already in pipeline order."""
        planned = self.plan(gathered)
        return planned.problem, planned.schedule

    def plan(self, gathered: GatheredLengths) -> PlannedBatch:
        """The schedule in pipeline order and its statistics (:func:`plan_batch`)."""
        return plan_batch(gathered, self.dp_size, self.cp_size, self.config)

    def reroute(self, samples: list[dict], schedule, gathered: GatheredLengths) -> dict:
        """{global id: real tokens/labels/loss_mask (+ extra token fields)} for every sample
        this rank runs. A per-token field of the samples that is neither carried nor declared
        in ``extra_token_fields`` is refused in one line (never silently dropped)."""
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
        seqlen_sum, squared_sum, windowed_sum = length_sums(gathered.lengths,
                                                            self.config.attention_window)
        return StepBatches(
            microbatches=microbatches, num_microbatches=schedule.num_microbatches(),
            seqlen_sum=seqlen_sum, seqlen_squared_sum=squared_sum,
            stats=dict(planned.stats), seqlen_windowed_squared_sum=windowed_sum,
        )

    def _microbatch_inputs(self, schedule, microbatch: int, mine: dict) -> dict:
        ids = schedule.microbatches[microbatch][self.rank]
        shape = self.config.thd_shape
        if not ids:
            pack = thd_microbatch.dummy_pack(
                self.config.pad_id, self.config.sp_factor,
                shape.rank_tokens(idle_rank_tokens(self.config)), self.config.extra_token_fields)
            return thd_microbatch.build_model_inputs(pack, 0, None, self.device,
                                                     shape.cu_seqlens_entries)
        group_ranks = schedule.group_ranks(microbatch, self.rank)
        padded = [schedule.padded_lengths[sid] for sid in ids]
        size = len(group_ranks)
        pack = thd_microbatch.pack_sequences(
            [mine[sid] for sid in ids], padded, local_cp_size=size, pad_id=self.config.pad_id,
            sample_ids=tuple(ids), total_tokens=shape.rank_tokens(sum(padded) // size) * size,
            extra_fields=self.config.extra_token_fields, tail_policy=shape.tail_policy)
        return thd_microbatch.build_model_inputs(
            pack, group_ranks.index(self.rank), self._process_group(group_ranks), self.device,
            shape.cu_seqlens_entries)

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


# The one field Megatron-LM's seed API reads from its config (e.g. a TransformerConfig).
SEED_BUDGET_FIELD = "max_seqlen_per_dp_cp_rank"
# Fields of a packed sample that describe its sub-samples' boundaries, not tokens.
_BOUNDARY_KEYS = frozenset({"cu_seqlens", "cu_seqlens_padded", "max_seqlen", "batch_idx"})
# PackingConfig fields a seed-API config may carry; the budget is read from SEED_BUDGET_FIELD.
_OPTIONAL_FIELDS = tuple(f.name for f in fields(PackingConfig) if f.name != "max_seqlen_per_rank")
_SEED_DEFAULTS = {"scheduler": DYNAMIC_CP, "pad_id": 0}


def packing_config_from(config) -> PackingConfig:
    """Our :class:`PackingConfig` for a seed-API ``config``: its ``max_seqlen_per_dp_cp_rank``
    is the budget, any :class:`PackingConfig` field it carries is taken, the rest are our
    defaults (scheduler ``default_dynamic_cp``). A :class:`PackingConfig` is used as it is."""
    if isinstance(config, PackingConfig):
        return config
    budget = getattr(config, SEED_BUDGET_FIELD, None)
    if budget is None:
        raise ValueError(
            f"config {type(config).__name__} has no {SEED_BUDGET_FIELD} (the tokens one DP x CP "
            "rank holds per micro-batch): set it, e.g. on megatron-core's TransformerConfig")
    given = {name: getattr(config, name) for name in _OPTIONAL_FIELDS
             if getattr(config, name, None) is not None}
    return PackingConfig(max_seqlen_per_rank=budget, **{**_SEED_DEFAULTS, **given})


class DynamicCPScheduler:
    """Megatron-LM's scheduler interface (``get_groups_and_subsamples``) over our registry's
    scheduler: ``default_dynamic_cp`` unless the config names another."""

    def __init__(self, config: PackingConfig, dp_size: int, cp_size: int):
        self.config = config
        self.dp_size = dp_size
        self.cp_size = cp_size

    def get_groups_and_subsamples(self, sample_id_seqlens, config=None, owners=None):
        """``(groups, sample_id_groups)`` for ``[(global id, length)]``: per group (a
        micro-batch), per DP x CP rank, the lengths and the ids it runs. The ranks listing an id
        in a group are its CP group. ``config`` is accepted for Megatron-LM's signature (the
        budget is the constructor's); ``owners`` (replica of each id, in the same order) is
        needed only by the ``empty`` scheduler."""
        ids = [int(sid) for sid, _ in sample_id_seqlens]
        lengths = tuple(int(length) for _, length in sample_id_seqlens)
        gathered = GatheredLengths(lengths, tuple(owners) if owners is not None else None, 0)
        schedule = plan_batch(gathered, self.dp_size, self.cp_size, self.config).schedule
        groups = [[[lengths[k] for k in ranks_ids] for ranks_ids in mb]
                  for mb in schedule.microbatches]
        sample_id_groups = [[[ids[k] for k in ranks_ids] for ranks_ids in mb]
                            for mb in schedule.microbatches]
        return groups, sample_id_groups


def _subsample_spans(sample: dict) -> list[tuple[int, int]]:
    """(start, real length) of each non-empty sub-sample of a packed sample: lengths from
    ``cu_seqlens``, starts from ``cu_seqlens_padded`` when the stream is padded per sequence."""
    real = [int(v) for v in sample["cu_seqlens"].tolist()]
    starts = [int(v) for v in sample.get("cu_seqlens_padded", sample["cu_seqlens"]).tolist()]
    return [(starts[k], real[k + 1] - real[k]) for k in range(len(real) - 1)
            if real[k + 1] > real[k]]


def _replica_of(gid: int, offsets) -> int:
    """The DP replica whose block of global ids (starting at ``offsets[d]``) holds ``gid``."""
    return bisect.bisect_right([int(o) for o in offsets], int(gid)) - 1


class HybridCPDataLoaderWrapper:
    """Megatron-LM's seed API (megatron-core 0.16.1's ``HybridCPDataLoaderWrapper``): its
    signatures and return values, our scheduler behind them, on CUDA or CPU ranks.

    ``data_iterator`` yields, per global batch, this DP replica's list of packed samples (dicts
    with ``cu_seqlens`` and per-token fields); ``next()`` returns ``(sub-samples this rank runs
    by global id, sample_id_groups)``. Production code uses :class:`GlobalBatchPacker`, which
    also packs, CP-splits and builds PackedSeqParams (docs/PACKING.md, docs/MIGRATING.md).

    Args:
        data_iterator: as above; None (a rank that does not read data) makes ``next()`` return
            ``(None, None)``.
        config: any object with ``max_seqlen_per_dp_cp_rank`` (see :func:`packing_config_from`).
        pg_collection: groups with ``dp`` and ``dp_cp`` (e.g. megatron-core's
            ProcessGroupCollection); default: megatron parallel_state's.
    """

    def __init__(self, data_iterator, config, pg_collection=None):
        self.data_iterator = data_iterator
        self.config = config
        self.packing_config = packing_config_from(config)
        if pg_collection is None:
            self.dp_group = parallel_state.get_data_parallel_group()
            self.dp_cp_group = parallel_state.get_data_parallel_group(with_context_parallel=True)
        else:
            self.dp_group, self.dp_cp_group = pg_collection.dp, pg_collection.dp_cp
        self.dp_size = dist.get_world_size(self.dp_group)
        self.total_hdp_gpus = dist.get_world_size(self.dp_cp_group)
        self.cp_size = self.total_hdp_gpus // self.dp_size
        self.device = get_device()
        self.cp_balancing_scheduler = DynamicCPScheduler(self.packing_config, self.dp_size,
                                                         self.cp_size)

    def __iter__(self):
        return self

    def get_global_seqlens(self, subsample_seqlens) -> tuple[list[int], torch.Tensor]:
        """``(lengths of every sub-sample of the global batch, DP-rank-major; offsets)``:
        ``offsets[d]`` (int32, CPU) is the global id of replica d's first sub-sample."""
        local = [int(n) for n in torch.as_tensor(subsample_seqlens).reshape(-1).tolist()]
        gathered = gather_lengths(local, self.dp_group)
        counts = [gathered.owners.count(d) for d in range(self.dp_size)]
        starts = [sum(counts[:d]) for d in range(self.dp_size)]
        return list(gathered.lengths), torch.tensor(starts, dtype=torch.int32)

    def get_global_id_seqlens(self, num_local_subsamples: int, offsets, seqlens_gathered):
        """``([(global id, length)], global ids of this replica's sub-samples)``, the ids an
        int32 tensor on this rank's device."""
        first = int(offsets[dist.get_rank(self.dp_group)])
        ids = torch.arange(first, first + int(num_local_subsamples), dtype=torch.int32,
                           device=self.device)
        return [(gid, int(length)) for gid, length in enumerate(seqlens_gathered)], ids

    def _gid_to_src_rank(self, gid: int, offsets) -> int:
        """The DP x CP rank that sends sub-sample ``gid`` to this rank: the owning replica's
        rank in this rank's CP lane."""
        return reroute.lane_rank(_replica_of(gid, offsets), dist.get_rank(self.dp_cp_group),
                                 self.cp_size)

    def reroute_samples_to_hdp_ranks(self, batch, global_ids_this_rank, global_id_seqlens,
                                     sample_id_groups, offsets) -> dict:
        """{global id: {field: tensor}} of every sub-sample this rank runs (in any group), in id
        order, on this rank's device. ``batch``: this replica's sub-samples, in id order. A field
        neither Megatron-LM's nor declared in the config's ``extra_token_fields`` is refused in
        one line ("hdp": Megatron-LM's hybrid data x context parallel ranks)."""
        ids = [int(gid) for gid in torch.as_tensor(global_ids_this_rank).tolist()]
        if len(ids) != len(batch):
            raise ValueError(f"{len(batch)} sub-samples but {len(ids)} global ids on this rank: "
                             "pass the ids get_global_id_seqlens() returned for this batch")
        lengths = dict(global_id_seqlens)
        owners = {gid: _replica_of(gid, offsets) for gid in lengths}
        return reroute.reroute_subsamples(
            dict(zip(ids, batch)), sample_id_groups, owners, lengths, self.cp_size,
            self.dp_cp_group, self.device, self.packing_config.extra_token_fields)

    def unpack_batch(self, batch: list[dict]) -> list[dict]:
        """Packed samples -> their non-empty sub-samples (views), boundary fields dropped."""
        return [{key: value[start: start + length] if reroute.is_per_token(value) else value
                 for key, value in sample.items() if key not in _BOUNDARY_KEYS}
                for sample in batch for start, length in _subsample_spans(sample)]

    def __next__(self):
        """``(sub-samples this rank runs by global id, sample_id_groups)`` of the next global
        batch: gather lengths, schedule, unpack, reroute."""
        if self.data_iterator is None:
            return None, None
        batch = next(self.data_iterator)
        local = [length for sample in batch for _, length in _subsample_spans(sample)]
        lengths, offsets = self.get_global_seqlens(local)
        id_seqlens, ids_here = self.get_global_id_seqlens(len(local), offsets, lengths)
        owners = [_replica_of(gid, offsets) for gid, _ in id_seqlens]
        _, sample_id_groups = self.cp_balancing_scheduler.get_groups_and_subsamples(
            id_seqlens, self.config, owners)
        samples = self.reroute_samples_to_hdp_ranks(self.unpack_batch(batch), ids_here,
                                                    id_seqlens, sample_id_groups, offsets)
        return samples, sample_id_groups



def idle_rank_tokens(config: PackingConfig) -> int:
    """Tokens of the pad-only pack a rank the schedule left idle runs, before tail padding."""
    return thd_microbatch.DUMMY_SEQUENCE_TOKENS * config.sp_factor


def token_slots(schedule, config: PackingConfig) -> int:
    """Token slots every rank runs in the global batch: sequences padded for their CP groups,
    idle ranks' pad-only packs and each rank's tail padding (fixed THD shapes)."""
    shape = config.thd_shape
    slots = 0
    for microbatch in schedule.microbatches:
        for ids in microbatch:
            size = schedule.cp_sizes[ids[0]] if ids else 1
            tokens = sum(schedule.padded_lengths[sid] for sid in ids) // size
            slots += shape.rank_tokens(tokens if ids else idle_rank_tokens(config))
    return slots


def schedule_stats(problem, schedule, config: PackingConfig, costs: ScheduleCosts) -> dict:
    """Padding ratio and schedule imbalance (critical path / perfectly balanced time), from
    the schedule's ``costs`` (evaluated once, when the schedule was made)."""
    real = sum(problem.lengths)
    slots = token_slots(schedule, config)
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
