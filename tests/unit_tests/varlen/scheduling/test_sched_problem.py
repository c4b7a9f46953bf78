"""Padding rule, ScheduleProblem validation and Schedule accessors."""

import pytest

from megatron.varlen.scheduling import ScheduleProblem, get_scheduler, padded_length


@pytest.mark.parametrize("length, cp, sp, expected", [
    (1, 1, 1, 1), (7, 1, 2, 8), (7, 2, 1, 8), (9, 2, 1, 12), (9, 3, 2, 12), (13, 3, 2, 24),
    (100, 4, 1, 104),
])
def test_padded_length(length, cp, sp, expected):
    assert padded_length(length, cp, sp) == expected


def test_too_long_sequence_names_value_limit_and_flag():
    with pytest.raises(ValueError) as error:
        ScheduleProblem(lengths=(10, 9000), dp_size=2, cp_size=2, max_seqlen_per_rank=1000)
    message = str(error.value)
    assert "9000" in message and "1000" in message and "--max-seqlen-per-dp-cp-rank" in message
    assert "\n" not in message


def test_min_size_above_ranks_names_flag():
    with pytest.raises(ValueError, match=r"min dynamic CP size 9 exceeds DPxCP=8.*"
                                         r"--min-dynamic-context-parallel-size"):
        ScheduleProblem(lengths=(10,), dp_size=4, cp_size=2, max_seqlen_per_rank=100,
                        min_cp_size=9)


@pytest.mark.parametrize("field, value, flag", [
    ("dp_size", 0, "--data-parallel-size"), ("cp_size", -1, "--context-parallel-size"),
    ("max_seqlen_per_rank", 0, "--max-seqlen-per-dp-cp-rank"),
    ("vpp_group_size", 0, "--microbatch-group-size-per-virtual-pipeline-stage"),
])
def test_bad_sizes(field, value, flag):
    kwargs = dict(lengths=(10,), dp_size=2, cp_size=2, max_seqlen_per_rank=100)
    kwargs[field] = value
    with pytest.raises(ValueError, match=flag):
        ScheduleProblem(**kwargs)


def test_bad_owners_and_lengths():
    with pytest.raises(ValueError, match="owner DP rank 5"):
        ScheduleProblem(lengths=(10, 10), dp_size=2, cp_size=1, max_seqlen_per_rank=100,
                        owners=(0, 5))
    with pytest.raises(ValueError, match="length 0 must be >= 1"):
        ScheduleProblem(lengths=(10, 0), dp_size=2, cp_size=1, max_seqlen_per_rank=100)


def test_static_scheduler_error_names_flags():
    problem = ScheduleProblem(lengths=(10, 300), dp_size=4, cp_size=1, max_seqlen_per_rank=100)
    with pytest.raises(ValueError, match="--max-seqlen-per-dp-cp-rank or --context-parallel"):
        get_scheduler("dp_balanced")(problem)
    assert get_scheduler("default_dynamic_cp")(problem).cp_sizes[1] == 4


def test_schedule_accessors():
    problem = ScheduleProblem(lengths=(700, 10, 10), dp_size=2, cp_size=2, max_seqlen_per_rank=200)
    schedule = get_scheduler("default_dynamic_cp")(problem)
    for microbatch in range(schedule.num_microbatches()):
        for rank in range(problem.num_ranks):
            group = schedule.group_ranks(microbatch, rank)
            assert rank in group and len(group) == schedule.local_cp_size(microbatch, rank)
            for member in group:
                assert schedule.microbatches[microbatch][member] == \
                    schedule.microbatches[microbatch][rank]
    assert schedule.cp_sizes[0] == 4


def test_unknown_scheduler():
    with pytest.raises(ValueError,
                       match="unknown scheduler 'fastest'.*--sequence-packing-scheduler"):
        get_scheduler("fastest")
    assert get_scheduler("default") is get_scheduler("dp_balanced")
