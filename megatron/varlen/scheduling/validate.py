"""``validate_schedule``: every invariant a schedule must hold, with complete messages."""

from __future__ import annotations

from megatron.varlen.scheduling.counts import target_microbatch_count
from megatron.varlen.scheduling.groups import GroupLayout
from megatron.varlen.scheduling.problem import Schedule, ScheduleProblem, padded_length


def _default_layout(problem: ScheduleProblem, schedule: Schedule) -> GroupLayout:
    """Static layout if every sequence uses cp_size, else the dynamic layout."""
    if all(size == problem.cp_size for size in schedule.cp_sizes):
        return problem.static_layout
    return problem.layout


def _check_shapes(problem: ScheduleProblem, schedule: Schedule) -> None:
    num = problem.num_sequences
    assert len(schedule.cp_sizes) == num, (
        f"cp_sizes has {len(schedule.cp_sizes)} entries for {num} sequences")
    assert len(schedule.padded_lengths) == num, (
        f"padded_lengths has {len(schedule.padded_lengths)} entries for {num} sequences")
    for index, ranks in enumerate(schedule.microbatches):
        assert len(ranks) == problem.num_ranks, (
            f"micro-batch {index} lists {len(ranks)} ranks, expected {problem.num_ranks}")


def _check_sequences(problem: ScheduleProblem, schedule: Schedule, layout: GroupLayout) -> None:
    allowed = set(layout.sequence_sizes)
    for seq, (length, size, padded) in enumerate(
            zip(problem.lengths, schedule.cp_sizes, schedule.padded_lengths)):
        assert size in allowed, (
            f"sequence {seq} has CP size {size}, allowed sizes are {sorted(allowed)}")
        expected = padded_length(length, size, problem.sp_factor)
        assert padded == expected, (
            f"sequence {seq} (length {length}, CP {size}) padded to {padded}, expected {expected}")


def _check_microbatch(problem: ScheduleProblem, schedule: Schedule, index: int,
                      seen: list[int]) -> None:
    """Groups are aligned blocks with identical id tuples; the budget holds on every rank."""
    ranks = schedule.microbatches[index]
    rank = 0
    while rank < problem.num_ranks:
        ids = ranks[rank]
        if not ids:
            rank += 1
            continue
        size = schedule.cp_sizes[ids[0]]
        assert rank % size == 0, (
            f"micro-batch {index}: rank {rank} starts a group of size {size} at an unaligned rank")
        for member in range(rank, rank + size):
            assert member < problem.num_ranks and ranks[member] == ids, (
                f"micro-batch {index}: rank {member} holds {ranks[min(member, len(ranks) - 1)]}, "
                f"its group {rank}..{rank + size - 1} holds {ids}")
        tokens = 0
        for seq in ids:
            assert schedule.cp_sizes[seq] == size, (
                f"micro-batch {index}: rank {rank} mixes CP sizes {size} and "
                f"{schedule.cp_sizes[seq]} (sequence {seq})")
            seen[seq] += 1
            tokens += schedule.padded_lengths[seq] // size
        assert tokens <= problem.max_seqlen_per_rank, (
            f"micro-batch {index}: ranks {rank}..{rank + size - 1} hold {tokens} tokens, "
            f"budget is {problem.max_seqlen_per_rank}")
        rank += size


def _check_counts(problem: ScheduleProblem, schedule: Schedule) -> None:
    count = schedule.num_microbatches()
    assert count % problem.vpp_group_size == 0, (
        f"{count} micro-batches is not a multiple of the VPP group size {problem.vpp_group_size}")
    nonempty = sum(1 for ranks in schedule.microbatches if any(ranks))
    wanted = min(problem.min_num_microbatches, problem.num_sequences)
    assert nonempty >= wanted, (
        f"{nonempty} non-empty micro-batches, fewer than min(pipeline stages "
        f"{problem.min_num_microbatches}, sequences {problem.num_sequences}) = {wanted}")
    expected = target_microbatch_count(nonempty, problem.num_sequences,
                                       problem.min_num_microbatches, problem.vpp_group_size)
    assert nonempty == count or (nonempty == problem.num_sequences and count == expected), (
        f"{count - nonempty} empty micro-batches although {problem.num_sequences} sequences "
        f"could fill {problem.num_sequences} micro-batches (needed {expected})")


def validate_schedule(problem: ScheduleProblem, schedule: Schedule,
                      layout: GroupLayout | None = None) -> None:
    """Checks every invariant of ``schedule`` for ``problem``.

    Args:
        problem: The scheduled problem.
        schedule: The schedule to check.
        layout: Groups that may be used; by default the static layout when every sequence
            uses cp_size, else ``problem.layout``.

    Raises:
        AssertionError: naming the micro-batch, ranks, sequence and violated limit.
    """
    layout = layout or _default_layout(problem, schedule)
    assert layout.num_ranks == problem.num_ranks, (
        f"layout covers {layout.num_ranks} ranks, problem has {problem.num_ranks}")
    _check_shapes(problem, schedule)
    _check_sequences(problem, schedule, layout)
    seen = [0] * problem.num_sequences
    for index in range(schedule.num_microbatches()):
        _check_microbatch(problem, schedule, index, seen)
    for seq, count in enumerate(seen):
        assert count == 1, f"sequence {seq} is scheduled {count} times, expected exactly once"
    _check_counts(problem, schedule)


def idle_rank_slots(schedule: Schedule) -> int:
    """Number of (micro-batch, rank) pairs with no sequence inside non-empty micro-batches."""
    return sum(sum(1 for ids in ranks if not ids)
               for ranks in schedule.microbatches if any(ranks))
