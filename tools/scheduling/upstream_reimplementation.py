"""Our own re-implementation of upstream's two schedulers (a reference baseline, not upstream).

Written only from a prose description of upstream Megatron-LM's algorithms, summarised in the
two items below (no upstream code was read or copied); where that description is silent the
choice is noted. Not registered for training; tools/schedule_sim.py offers these as
``--scheduler reimpl_upstream_dp_balanced`` / ``reimpl_upstream_dynamic_cp``. The benchmark's
upstream columns come from upstream's own code instead (tools/upstream_schedulers.py).

* ``reimpl_upstream_dp_balanced``: next-fit in arrival order, up to budget * cp padded tokens
  per bin (one bin = one DP rank's CP group in one micro-batch); bin j goes to micro-batch
  j // dp on DP rank j % dp; the bin count is padded with empty bins to a multiple of
  dp * VPP group size. Blind to the L^2 term.
* ``reimpl_upstream_dynamic_cp``: sequences sorted longest first; one micro-batch at a time;
  minimal CP size = smallest power of two with L/c <= budget (clamped to the minimum size); a
  new group may be doubled while that lowers the slowest rank's work; per-rank work cap
  1.05 * longest L * budget; what does not fit is deferred to the next micro-batch; empty ranks
  are filled by doubling the most loaded group that fits. Work = L^2 / c (upstream's cost
  model). Our choices: a sequence prefers a new group while ranks are free, else joins the
  least-loaded group it fits.

Padding follows our rule (roundup to 2*c*sp); upstream pads to 2*N under dynamic CP, which would
only make its schedules slower, so the comparison is generous to upstream.
"""

from __future__ import annotations

from megatron.varlen.scheduling.problem import Schedule, ScheduleProblem, padded_length

WORK_CAP_FACTOR = 1.05


def padded_lengths(problem: ScheduleProblem, cp_sizes: list[int]) -> tuple[int, ...]:
    """Every sequence's padded length for its CP size (0: unscheduled, padded for one rank)."""
    return tuple(padded_length(length, max(size, 1), problem.sp_factor)
                 for length, size in zip(problem.lengths, cp_sizes))


def reimpl_upstream_dp_balanced(problem: ScheduleProblem) -> Schedule:
    """Upstream-style dp_balanced (next-fit, token-only)."""
    cp, dp = problem.cp_size, problem.dp_size
    capacity = problem.max_seqlen_per_rank * cp
    bins: list[list[int]] = []
    used = capacity + 1  # forces a first bin
    for seq, length in enumerate(problem.lengths):
        tokens = padded_length(length, cp, problem.sp_factor)
        if tokens > capacity:
            raise ValueError(f"sequence of length {length} exceeds the static CP budget "
                             f"{capacity} (raise --max-seqlen-per-dp-cp-rank)")
        if used + tokens > capacity:
            bins.append([])
            used = 0
        bins[-1].append(seq)
        used += tokens
    multiple = dp * problem.vpp_group_size
    padding = -len(bins) % multiple if bins else multiple
    bins.extend([] for _ in range(padding))
    microbatches = []
    for start in range(0, len(bins), dp):
        ranks: list[tuple[int, ...]] = []
        for members in bins[start:start + dp]:
            ranks.extend([tuple(members)] * cp)
        microbatches.append(tuple(ranks))
    cp_sizes = [cp] * problem.num_sequences
    return Schedule(microbatches=tuple(microbatches), cp_sizes=tuple(cp_sizes),
                    padded_lengths=padded_lengths(problem, cp_sizes))


def _min_power_of_two(problem: ScheduleProblem, length: int) -> int:
    size = 1
    while size < problem.min_cp_size or (
            padded_length(length, size, problem.sp_factor) // size > problem.max_seqlen_per_rank):
        size *= 2
    return size


class _UpstreamGroup:
    """One CP group of a micro-batch under construction: size, member ids, per-rank loads."""

    def __init__(self, size: int) -> None:
        self.size, self.ids, self.work, self.tokens = size, [], 0.0, 0

    def add(self, seq: int, problem: ScheduleProblem) -> None:
        padded = padded_length(problem.lengths[seq], self.size, problem.sp_factor)
        self.ids.append(seq)
        self.work += padded * padded / self.size
        self.tokens += padded // self.size

    def fits(self, seq: int, problem: ScheduleProblem, cap: float) -> bool:
        padded = padded_length(problem.lengths[seq], self.size, problem.sp_factor)
        return (self.tokens + padded // self.size <= problem.max_seqlen_per_rank
                and self.work + padded * padded / self.size <= cap)


class _UpstreamMicrobatch:
    """Groups of one micro-batch plus the free rank count."""

    def __init__(self, num_ranks: int, budget: int, cap: float) -> None:
        self.groups: list[_UpstreamGroup] = []
        self.free, self.budget, self.cap = num_ranks, budget, cap
        self.max_size, self.max_room = 1, 0

    def place(self, seq: int, problem: ScheduleProblem) -> bool:
        """Places one sequence; False if it must be deferred."""
        length = problem.lengths[seq]
        size = _min_power_of_two(problem, length)
        if size <= self.free:
            slowest = max((group.work for group in self.groups), default=0.0)
            while 2 * size <= self.free and 0.0 < slowest < length * length / size:
                size *= 2  # a larger group lowers the slowest rank
            self._open(size, seq, problem)
            return True
        if length / self.max_size > self.max_room:
            return False  # fits no group's token room (cheap pre-check)
        fitting = [(group.work, index) for index, group in enumerate(self.groups)
                   if group.size >= size and group.fits(seq, problem, self.cap)]
        if not fitting:
            return False
        self.groups[min(fitting)[1]].add(seq, problem)
        self._refresh_room()
        return True

    def _open(self, size: int, seq: int, problem: ScheduleProblem) -> None:
        group = _UpstreamGroup(size)
        group.add(seq, problem)
        self.groups.append(group)
        self.free -= size
        self.max_size = max(self.max_size, size)
        self._refresh_room()

    def _refresh_room(self) -> None:
        self.max_room = self.budget - min(group.tokens for group in self.groups)

    def fill_by_doubling(self, problem: ScheduleProblem) -> None:
        """Doubles the most loaded group that fits the free ranks until none are free."""
        while self.free > 0:
            fitting = [(group.work, -index) for index, group in enumerate(self.groups)
                       if group.size <= self.free]
            if not fitting:
                return
            index = -max(fitting)[1]
            old = self.groups[index]
            self.free -= old.size
            grown = _UpstreamGroup(2 * old.size)
            for seq in old.ids:
                grown.add(seq, problem)
            self.groups[index] = grown


def reimpl_upstream_dynamic_cp(problem: ScheduleProblem) -> Schedule:
    """Upstream-style default_dynamic_cp (power-of-two groups, L^2 work, 1.05 cap)."""
    num_ranks = problem.num_ranks
    if num_ranks & (num_ranks - 1):
        raise ValueError(f"upstream dynamic CP needs a power-of-two DPxCP, got {num_ranks}")
    remaining = [seq for _, seq in sorted((-length, seq)
                                          for seq, length in enumerate(problem.lengths))]
    layouts, cp_sizes = [], [0] * problem.num_sequences
    while remaining:
        cap = WORK_CAP_FACTOR * problem.lengths[remaining[0]] * problem.max_seqlen_per_rank
        microbatch = _UpstreamMicrobatch(num_ranks, problem.max_seqlen_per_rank, cap)
        remaining = [seq for seq in remaining if not microbatch.place(seq, problem)]
        microbatch.fill_by_doubling(problem)
        layouts.append(_lay_out(microbatch.groups, num_ranks, cp_sizes))
    return Schedule(microbatches=tuple(layouts), cp_sizes=tuple(cp_sizes),
                    padded_lengths=padded_lengths(problem, cp_sizes))


def _lay_out(groups: list[_UpstreamGroup], num_ranks: int,
             cp_sizes: list[int]) -> tuple[tuple[int, ...], ...]:
    ranks: list[tuple[int, ...]] = [()] * num_ranks
    start = 0
    for _, index in sorted((-group.size, index) for index, group in enumerate(groups)):
        members = tuple(groups[index].ids)
        ranks[start:start + groups[index].size] = [members] * groups[index].size
        for seq in members:
            cp_sizes[seq] = groups[index].size
        start += groups[index].size
    return tuple(ranks)
