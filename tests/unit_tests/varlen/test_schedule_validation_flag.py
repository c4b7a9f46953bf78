"""--validate-packing-schedules: every step's schedule checked before it runs.

The schedulers' invariants are tested offline (tests/unit_tests/varlen/scheduling); this flag is
the run-time debug check. Its tests: the flag reaches the packing path, valid schedules pass
for every scheduler, and a scheduler that breaks an invariant stops the step with one message
naming the broken invariant (the check is not a no-op).
"""

from __future__ import annotations

import dataclasses

import pytest

from megatron.varlen.packing import InvalidScheduleError, data_schedule
from megatron.varlen.packing.data_schedule import GatheredLengths, PackingConfig, plan_batch
from megatron.varlen.scheduling import get_scheduler
from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.data import build_packing_config

LENGTHS = (700, 64, 33, 512, 9, 250, 1000, 77, 128, 5, 300, 41)
DP, CP = 2, 2


def _gathered(lengths=LENGTHS) -> GatheredLengths:
    return GatheredLengths(lengths=lengths, owners=tuple(i % DP for i in range(len(lengths))),
                           first_id=0)


def _config(scheduler: str) -> PackingConfig:
    return PackingConfig(scheduler=scheduler, max_seqlen_per_rank=512, pad_id=0,
                         validate_schedules=True)


@pytest.mark.parametrize("scheduler", ["dp_balanced", "default_dynamic_cp", "empty"])
def test_valid_schedules_pass(scheduler):
    planned = plan_batch(_gathered(), DP, CP, _config(scheduler))
    scheduled = sorted(i for mb in planned.schedule.microbatches for rank in mb for i in rank)
    assert set(scheduled) == set(range(len(LENGTHS)))


def _dropping_last_sequence(name):
    """A scheduler with a bug: the real schedule with the last sequence's id removed."""
    real = get_scheduler(name)

    def broken(problem):
        schedule = real(problem)
        last = problem.num_sequences - 1
        microbatches = tuple(tuple(tuple(i for i in ids if i != last) for ids in mb)
                             for mb in schedule.microbatches)
        return dataclasses.replace(schedule, microbatches=microbatches)
    return broken


def test_invalid_schedule_stops_the_step_naming_the_invariant(monkeypatch):
    monkeypatch.setattr(data_schedule, "get_scheduler", _dropping_last_sequence)
    with pytest.raises(InvalidScheduleError) as caught:
        plan_batch(_gathered(), DP, CP, _config("default_dynamic_cp"))
    message = str(caught.value)
    assert f"sequence {len(LENGTHS) - 1} is scheduled 0 times" in message
    assert "--validate-packing-schedules" in message and "\n" not in message


def test_without_the_flag_nothing_is_checked(monkeypatch):
    monkeypatch.setattr(data_schedule, "get_scheduler", _dropping_last_sequence)
    config = dataclasses.replace(_config("default_dynamic_cp"), validate_schedules=False)
    plan_batch(_gathered(), DP, CP, config)  # the (broken) schedule is used as it is


@pytest.mark.parametrize("flag", [False, True])
def test_flag_reaches_the_packing_config(flag):
    argv = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
            "--seq-length", "64", "--micro-batch-size", "1", "--global-batch-size", "4",
            "--mock-data", "--sequence-packing", "--tokenizer-type", "NullTokenizer",
            "--vocab-size", "128", "--train-iters", "1", "--lr", "1e-3"]
    argv += ["--validate-packing-schedules"] if flag else []
    run = parse_run_config(argv, world_size=1)
    assert build_packing_config(run, pad_id=0).validate_schedules is flag


def test_entry_points_print_it_once_in_one_line(capsys):
    from megatron.varlen_training.errors import exit_on_user_errors

    with pytest.raises(SystemExit) as stopped, exit_on_user_errors("pretrain_gpt.py"):
        raise InvalidScheduleError("scheduler 'x' produced an invalid schedule: sequence 3 ...")
    assert stopped.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pretrain_gpt.py: error: scheduler 'x'")
