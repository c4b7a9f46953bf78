"""validate_schedule catches each broken invariant with a complete message."""

import dataclasses

import pytest

from megatron.varlen.scheduling import ScheduleProblem, get_scheduler, validate_schedule

PROBLEM = ScheduleProblem(lengths=(2000, 700, 500, 300, 100), dp_size=2, cp_size=2,
                          max_seqlen_per_rank=1024)


def _schedule():
    schedule = get_scheduler("default_dynamic_cp")(PROBLEM)
    validate_schedule(PROBLEM, schedule)
    return schedule


def _with_ranks(schedule, microbatch, ranks):
    microbatches = list(schedule.microbatches)
    microbatches[microbatch] = tuple(ranks)
    return dataclasses.replace(schedule, microbatches=tuple(microbatches))


def test_missing_sequence():
    schedule = _schedule()
    index = next(i for i, ranks in enumerate(schedule.microbatches) if any(ranks))
    ranks = list(schedule.microbatches[index])
    victim = next(ids for ids in ranks if ids)
    ranks = [() if ids == victim else ids for ids in ranks]
    with pytest.raises(AssertionError, match=r"sequence \d+ is scheduled 0 times, expected "
                                             r"exactly once"):
        validate_schedule(PROBLEM, _with_ranks(schedule, index, ranks))


def test_group_members_disagree():
    schedule = get_scheduler("dp_balanced")(PROBLEM)
    index = next(i for i, ranks in enumerate(schedule.microbatches) if ranks[0])
    ranks = list(schedule.microbatches[index])
    ranks[1] = ranks[1] + ranks[1][:1] if ranks[1] else (0,)
    with pytest.raises(AssertionError, match="rank 1 holds"):
        validate_schedule(PROBLEM, _with_ranks(schedule, index, ranks))


def test_budget_exceeded():
    schedule = get_scheduler("default_dynamic_cp")(PROBLEM)
    fullest = max(sum(schedule.padded_lengths[seq] // schedule.cp_sizes[seq] for seq in ids)
                  for ranks in schedule.microbatches for ids in ranks)
    tight = dataclasses.replace(PROBLEM, max_seqlen_per_rank=fullest - 1)
    with pytest.raises(AssertionError, match=rf"hold {fullest} tokens, budget is {fullest - 1}"):
        validate_schedule(tight, schedule)


def test_wrong_padding_and_size():
    schedule = _schedule()
    padded = list(schedule.padded_lengths)
    padded[1] += 2
    with pytest.raises(AssertionError, match="sequence 1 .* padded to"):
        validate_schedule(PROBLEM, dataclasses.replace(schedule, padded_lengths=tuple(padded)))
    sizes = list(schedule.cp_sizes)
    sizes[0] = 3
    with pytest.raises(AssertionError, match="sequence 0 has CP size 3, allowed sizes"):
        validate_schedule(PROBLEM, dataclasses.replace(schedule, cp_sizes=tuple(sizes)))


def test_vpp_multiple_and_pipeline_depth():
    problem = dataclasses.replace(PROBLEM, vpp_group_size=2)
    schedule = get_scheduler("default_dynamic_cp")(problem)
    validate_schedule(problem, schedule)
    trimmed = dataclasses.replace(schedule, microbatches=schedule.microbatches[:1]
                                  + schedule.microbatches[2:])
    with pytest.raises(AssertionError):
        validate_schedule(problem, trimmed)
    deep = dataclasses.replace(PROBLEM, min_num_microbatches=5)
    with pytest.raises(AssertionError, match="fewer than min\\(pipeline stages 5"):
        validate_schedule(deep, _schedule())


def test_unaligned_group():
    schedule = get_scheduler("dp_balanced")(PROBLEM)
    index = next(i for i, ranks in enumerate(schedule.microbatches) if ranks[0])
    ranks = list(schedule.microbatches[index])
    ranks = ranks[1:] + ranks[:1]
    if ranks[0] == ranks[1]:
        pytest.skip("rotation kept alignment")
    with pytest.raises(AssertionError):
        validate_schedule(PROBLEM, _with_ranks(schedule, index, ranks))
