"""Problem and schedule dataclasses, padding rule and per-sequence feasibility.

Ranks are the N = dp_size * cp_size DPxCP ranks, rank = dp_rank * cp_size + cp_rank. A schedule
maps micro-batch -> rank -> tuple of sequence ids; the ranks that share an id in a micro-batch
are that sequence's CP group, an aligned block of the layout (see groups.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from megatron.varlen.scheduling.cost_model import CostModel
from megatron.varlen.scheduling.groups import (
    MIN_CP_FLAG,
    GroupLayout,
    build_group_layout,
    build_static_layout,
)

BUDGET_FLAG = "--max-seqlen-per-dp-cp-rank"
# A sequence split over c > 1 ranks is cut into 2*c equal chunks (causal load balance).
CHUNKS_PER_CP_RANK = 2


def pad_multiple(cp_size: int, sp_factor: int = 1) -> int:
    """What a sequence's token count must be a multiple of on ``cp_size`` ranks.

    2*cp_size*sp_factor if cp_size > 1 else sp_factor; sp_factor is the TP size when sequence
    parallelism is on, else 1. The one definition of this rule (datasets, argument checks and
    schedulers all use it).
    """
    return CHUNKS_PER_CP_RANK * cp_size * sp_factor if cp_size > 1 else sp_factor


def padded_length(length: int, cp_size: int, sp_factor: int = 1) -> int:
    """Padded length of a sequence given ``cp_size`` ranks: roundup to :func:`pad_multiple`."""
    multiple = pad_multiple(cp_size, sp_factor)
    return -(-length // multiple) * multiple


@dataclass(frozen=True)
class ScheduleProblem:
    """One global batch to schedule.

    Attributes:
        lengths: Real lengths; index = sequence id.
        dp_size: Data-parallel size.
        cp_size: Static context-parallel size.
        max_seqlen_per_rank: Token budget per rank per micro-batch, on padded tokens:
            sum over a rank's sequences of padded_len / c must not exceed it.
        min_cp_size: Smallest dynamic CP group size a sequence may get.
        sp_factor: TP size when sequence parallelism is on, else 1.
        vpp_group_size: The micro-batch count must be a multiple of this.
        min_num_microbatches: Pipeline stages; reached whenever there are enough sequences.
        owners: Optional DP rank that already holds each sequence (used by ``empty``).
        cost: Cost model coefficients.
    """

    lengths: tuple[int, ...]
    dp_size: int
    cp_size: int
    max_seqlen_per_rank: int
    min_cp_size: int = 1
    sp_factor: int = 1
    vpp_group_size: int = 1
    min_num_microbatches: int = 1
    owners: tuple[int, ...] | None = None
    cost: CostModel = field(default_factory=CostModel)

    def __post_init__(self) -> None:
        object.__setattr__(self, "lengths", tuple(map(int, self.lengths)))
        _check_sizes(self)
        if self.lengths and min(self.lengths) < 1:
            raise ValueError(f"sequence length {min(self.lengths)} must be >= 1")
        if self.owners is not None:
            _check_owners(self)
        if self.lengths:
            longest = max(self.lengths)
            need = padded_length(longest, self.num_ranks, self.sp_factor) // self.num_ranks
            if need > self.max_seqlen_per_rank:
                raise ValueError(
                    f"sequence of length {longest} needs {need} tokens per rank even on all "
                    f"DPxCP={self.num_ranks} ranks, above the budget {self.max_seqlen_per_rank} "
                    f"(raise {BUDGET_FLAG} or --max-seq-len)")

    @property
    def num_ranks(self) -> int:
        """N = dp_size * cp_size."""
        return self.dp_size * self.cp_size

    @property
    def num_sequences(self) -> int:
        """Number of sequences in the global batch."""
        return len(self.lengths)

    @functools.cached_property
    def layout(self) -> GroupLayout:
        """Dynamic-CP layout; the torch side must create exactly ``layout.groups``."""
        return build_group_layout(self.num_ranks, self.min_cp_size, self.cp_size)

    @functools.cached_property
    def static_layout(self) -> GroupLayout:
        """Static-CP layout (dp_balanced, empty)."""
        return build_static_layout(self.dp_size, self.cp_size)

    def min_feasible_size(self, length: int, sizes: tuple[int, ...]) -> int | None:
        """Smallest size in ``sizes`` whose per-rank padded tokens fit the budget, else None."""
        for size in sizes:
            if padded_length(length, size, self.sp_factor) // size <= self.max_seqlen_per_rank:
                return size
        return None


def _check_sizes(problem: ScheduleProblem) -> None:
    checks = (
        ("dp_size", problem.dp_size, "--data-parallel-size / world size"),
        ("cp_size", problem.cp_size, "--context-parallel-size"),
        ("max_seqlen_per_rank", problem.max_seqlen_per_rank, BUDGET_FLAG),
        ("sp_factor", problem.sp_factor, "--tensor-model-parallel-size"),
        ("vpp_group_size", problem.vpp_group_size,
         "--microbatch-group-size-per-virtual-pipeline-stage"),
        ("min_num_microbatches", problem.min_num_microbatches, "--pipeline-model-parallel-size"),
        ("min_cp_size", problem.min_cp_size, MIN_CP_FLAG),
    )
    for name, value, flag in checks:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be an integer >= 1 (check {flag})")
    if problem.min_cp_size > problem.num_ranks:
        raise ValueError(f"min dynamic CP size {problem.min_cp_size} exceeds DPxCP="
                         f"{problem.num_ranks} (lower {MIN_CP_FLAG})")


def _check_owners(problem: ScheduleProblem) -> None:
    owners = tuple(int(owner) for owner in problem.owners)
    object.__setattr__(problem, "owners", owners)
    if len(owners) != len(problem.lengths):
        raise ValueError(f"owners has {len(owners)} entries for {len(problem.lengths)} sequences")
    bad = [owner for owner in owners if not 0 <= owner < problem.dp_size]
    if bad:
        raise ValueError(f"owner DP rank {bad[0]} outside [0, dp_size={problem.dp_size})")


@dataclass(frozen=True)
class Schedule:
    """A schedule of one global batch.

    Attributes:
        microbatches: Per micro-batch, per DPxCP rank, the tuple of sequence ids it holds. All
            ranks of a sequence's group hold the identical tuple.
        cp_sizes: CP group size of each sequence id.
        padded_lengths: Padded length of each sequence id (depends on its CP size).
    """

    microbatches: tuple[tuple[tuple[int, ...], ...], ...]
    cp_sizes: tuple[int, ...]
    padded_lengths: tuple[int, ...]

    def num_microbatches(self) -> int:
        """Number of micro-batches (a multiple of the VPP group size)."""
        return len(self.microbatches)

    def local_cp_size(self, microbatch: int, rank: int) -> int:
        """CP group size of ``rank`` in ``microbatch`` (1 for a rank with no sequences)."""
        ids = self.microbatches[microbatch][rank]
        return self.cp_sizes[ids[0]] if ids else 1

    def group_ranks(self, microbatch: int, rank: int) -> tuple[int, ...]:
        """The ranks of ``rank``'s CP group in ``microbatch`` (an aligned block)."""
        size = self.local_cp_size(microbatch, rank)
        start = rank - rank % size
        return tuple(range(start, start + size))
