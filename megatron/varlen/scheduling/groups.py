"""Which dynamic context-parallel groups exist: the single source of truth.

The DPxCP ranks 0..N-1 (rank = dp_rank * cp_size + cp_rank) get a *divisor chain* of group sizes
``1 = s0 | s1 | ... | sk = N`` (each size divides the next) and, for every size, the aligned blocks
``[j*s, (j+1)*s)``. Blocks of different sizes nest like a buddy allocator, so any multiset of
chain sizes whose sum is at most N can be laid out without overlap by placing the blocks largest
first from rank 0 (every earlier block size is a multiple of the current one, so each block lands
aligned). Schedulers therefore only reason about sizes; positions follow.

The chain runs through the static CP size (so the static CP groups are dynamic groups too and a
dynamic schedule can always fall back to the static one) and through the smallest chain size that
is >= ``min_cp_size``; within those constraints it uses the prime factors in ascending order,
which gives the finest choice of small groups, where most sequences are. For N = 2^k this is the
familiar 1, 2, 4, ..., N. Every rank belongs to one block per size > 1: ``groups_per_rank()``
process groups, ``len(groups)`` in total.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_CP_FLAG = "--min-dynamic-context-parallel-size"


def _prime_factors(value: int) -> list[int]:
    """Prime factors of ``value`` in ascending order, with multiplicity."""
    factors, divisor = [], 2
    while divisor * divisor <= value:
        while value % divisor == 0:
            factors.append(divisor)
            value //= divisor
        divisor += 1
    if value > 1:
        factors.append(value)
    return factors


def _chain_through(num_ranks: int, anchor: int) -> list[int]:
    """Divisor chain 1 | ... | anchor | ... | num_ranks, ascending primes on each side."""
    sizes = [1]
    for factor in _prime_factors(anchor) + _prime_factors(num_ranks // anchor):
        sizes.append(sizes[-1] * factor)
    return sizes


@dataclass(frozen=True)
class GroupLayout:
    """The group sizes that exist over ``num_ranks`` ranks and their aligned blocks.

    Attributes:
        num_ranks: N = DP x CP.
        sizes: Ascending tuple of available sizes; each divides the next.
        min_size: Smallest group size a sequence may be given.
    """

    num_ranks: int
    sizes: tuple[int, ...]
    min_size: int = 1

    def __post_init__(self) -> None:
        assert self.sizes and self.sizes[0] == 1, f"sizes {self.sizes} must start at 1"
        for smaller, larger in zip(self.sizes, self.sizes[1:]):
            assert larger % smaller == 0 and larger > smaller, (
                f"sizes {self.sizes} must form a strictly increasing divisor chain")
        assert self.num_ranks % self.sizes[-1] == 0, (
            f"largest size {self.sizes[-1]} must divide num_ranks={self.num_ranks}")
        assert self.min_size in self.sizes, f"min_size {self.min_size} not in sizes {self.sizes}"

    @property
    def sequence_sizes(self) -> tuple[int, ...]:
        """Sizes a sequence may be given (>= min_size)."""
        return tuple(size for size in self.sizes if size >= self.min_size)

    @property
    def groups(self) -> tuple[tuple[int, ...], ...]:
        """Every group of size > 1 (size-1 groups need no process group), by size then start."""
        return tuple(tuple(range(start, start + size))
                     for size in self.sizes if size > 1
                     for start in range(0, self.num_ranks, size))

    def group_of(self, size: int, rank: int) -> tuple[int, ...]:
        """The aligned block of ``size`` ranks that contains ``rank``."""
        assert size in self.sizes, f"group size {size} does not exist; sizes are {self.sizes}"
        assert 0 <= rank < self.num_ranks, f"rank {rank} outside [0, {self.num_ranks})"
        start = rank - rank % size
        return tuple(range(start, start + size))

    def groups_per_rank(self) -> int:
        """Process groups each rank belongs to (one per size > 1)."""
        return sum(1 for size in self.sizes if size > 1)


def build_group_layout(num_ranks: int, min_cp_size: int = 1, cp_size: int = 1) -> GroupLayout:
    """Builds the dynamic-CP layout over ``num_ranks`` DPxCP ranks.

    Args:
        num_ranks: N = DP x CP.
        min_cp_size: --min-dynamic-context-parallel-size; the effective minimum is the smallest
            chain size >= this value.
        cp_size: The static --context-parallel-size; the chain passes through it.

    Raises:
        ValueError: if min_cp_size or cp_size is out of range.
    """
    if num_ranks < 1:
        raise ValueError(f"num_ranks={num_ranks} must be >= 1 (check the DP and CP sizes)")
    if not 1 <= min_cp_size <= num_ranks:
        raise ValueError(f"min CP size {min_cp_size} must be in [1, DPxCP={num_ranks}] "
                         f"(check {MIN_CP_FLAG})")
    if cp_size < 1 or num_ranks % cp_size:
        raise ValueError(f"cp_size={cp_size} must divide DPxCP={num_ranks} "
                         "(check --context-parallel-size)")
    chain = _chain_through(num_ranks, cp_size)
    if min_cp_size > cp_size and min_cp_size not in chain:
        # Re-anchor the chain at the smallest multiple of cp_size >= min that divides N.
        anchor = min(size for size in range(min_cp_size, num_ranks + 1)
                     if num_ranks % size == 0 and size % cp_size == 0)
        chain = _chain_through(num_ranks, cp_size)[:len(_prime_factors(cp_size)) + 1]
        for factor in _prime_factors(anchor // cp_size) + _prime_factors(num_ranks // anchor):
            chain.append(chain[-1] * factor)
    min_size = min(size for size in chain if size >= min_cp_size)
    return GroupLayout(num_ranks=num_ranks, sizes=tuple(chain), min_size=min_size)


def build_static_layout(dp_size: int, cp_size: int) -> GroupLayout:
    """The static layout: CP groups are the blocks [d*cp, (d+1)*cp); every sequence uses cp."""
    sizes = (1,) if cp_size == 1 else (1, cp_size)
    return GroupLayout(num_ranks=dp_size * cp_size, sizes=sizes, min_size=cp_size)
