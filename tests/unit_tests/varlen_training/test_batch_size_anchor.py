"""Where a resumed run's global batches begin (resumed_batch_anchor.py, batch_rampup.py's
anchor): the schedule against a step-by-step count of the samples read from the checkpoint's
consumed samples on (Megatron-LM's sampler); what the flag layer finds in a checkpoint and
what it sizes from it; which resumes keep refusing a changed --global-batch-size; the LR
schedule's refusal in the units of each side. Training runs: test_batch_size_resume.py.
No processes.
"""

import dataclasses
import json
import os
import types

import pytest

from megatron.varlen_training.arguments import parse_args
from megatron.varlen_training.batch_rampup import BatchAnchor, GlobalBatchSchedule, Rampup
from megatron.varlen_training.config.from_flags import run_config
from megatron.varlen_training.errors import CheckpointError
from megatron.varlen_training.load_options import TRACKER_FILENAME, iteration_folder
from megatron.varlen_training.resume.consistency import check_run_args, data_position_note
from megatron.varlen_training.resume.run_args_record import save_run_args
from megatron.varlen_training.resume.schedule_check import check_scheduler
from tests.harness.training_runs import TINY_GPT_ARGS


def _sampler_batches(anchor: BatchAnchor, gbs: int, num_samples: int) -> list[range]:
    """Megatron-LM's sampler from the checkpoint on: batches of ``gbs`` from the consumed
    samples while a whole one fits in ``num_samples``."""
    batches, consumed = [], anchor.first_sample
    while consumed + gbs <= num_samples:
        batches.append(range(consumed, consumed + gbs))
        consumed += gbs
    return batches


@pytest.mark.parametrize("anchor, gbs", [(BatchAnchor(0, 0), 4), (BatchAnchor(3, 12), 8),
                                         (BatchAnchor(5, 40), 3), (BatchAnchor(7, 10), 4)])
def test_the_schedule_reads_what_the_sampler_reads(anchor, gbs):
    schedule = GlobalBatchSchedule(gbs, 1, anchor=anchor)
    for num_samples in range(anchor.first_sample, anchor.first_sample + 5 * gbs):
        batches = _sampler_batches(anchor, gbs, num_samples)
        last = anchor.iteration + len(batches)
        assert [schedule.indices(i) for i in range(anchor.iteration, last)] == batches
        assert schedule.iterations_within(num_samples) == last
        assert schedule.train_iters(num_samples) == last
        assert schedule.first_sample(last) == anchor.first_sample + len(batches) * gbs


def test_a_ramp_up_has_no_anchor():
    with pytest.raises(ValueError):
        GlobalBatchSchedule(8, 1, Rampup(2, 2, 8), anchor=BatchAnchor(2, 4))


# --- the flag layer: what a checkpoint gives --------------------------------------------------

SAMPLES = ["--train-samples", "100"]


def _save(root, argv: list[str], iteration: int, consumed: int | None = None) -> None:
    """A checkpoint's tracker and run_args.json (the rest of a checkpoint is not read here)."""
    folder = iteration_folder(str(root), iteration)
    os.makedirs(folder, exist_ok=True)
    run = run_config(parse_args(TINY_GPT_ARGS + argv, world_size=1))
    save_run_args(folder, run, iteration=iteration, consumed_samples=consumed)
    (root / TRACKER_FILENAME).write_text(str(iteration))


def _args(*argv: str):
    return parse_args(TINY_GPT_ARGS + list(argv), world_size=1)


def test_a_larger_batch_starts_at_the_consumed_samples(tmp_path):
    """4 per step for 5 steps (20 samples), resumed with 8: 10 more steps fit --train-samples
    100 (Megatron-LM's 100 // 8 = 12 iterations would stop at sample 76)."""
    _save(tmp_path, SAMPLES, 5)
    args = _args(*SAMPLES, "--global-batch-size", "8", "--load", str(tmp_path))
    assert args.global_batch_anchor == (5, 20)
    assert args.train_iters == 15
    run = run_config(args)
    assert run.training.global_batch_anchor == (5, 20)
    assert GlobalBatchSchedule.of(run.training).indices(5) == range(20, 28)
    assert run.data.train_samples == 100


def test_an_iteration_based_run_sizes_its_data_from_the_anchor(tmp_path):
    _save(tmp_path, ["--train-iters", "10"], 5)
    run = run_config(_args("--train-iters", "10", "--global-batch-size", "8", "--load",
                           str(tmp_path)))
    assert run.data.train_samples == 20 + 5 * 8


def test_the_same_batch_size_continues_at_the_consumed_samples(tmp_path):
    """A checkpoint whose run trained batches of other sizes (megatron.wrap: 10 samples in 3
    steps) continues at its 10 samples; an ordinary one at iteration x its batch."""
    _save(tmp_path, SAMPLES, 3, consumed=10)
    assert _args(*SAMPLES, "--load", str(tmp_path)).global_batch_anchor == (3, 10)
    _save(tmp_path, SAMPLES, 4)
    assert _args(*SAMPLES, "--load", str(tmp_path)).global_batch_anchor == (4, 16)


def test_a_checkpoint_from_before_the_position_counts_its_batches(tmp_path):
    _save(tmp_path, SAMPLES, 5)
    record = tmp_path / "iter_0000005" / "run_args.json"
    saved = json.loads(record.read_text())
    del saved["consumed_train_samples"]
    record.write_text(json.dumps(saved))
    assert _args(*SAMPLES, "--global-batch-size", "8", "--load",
                 str(tmp_path)).global_batch_anchor == (5, 20)


@pytest.mark.parametrize("extra", [["--finetune"], ["--ckpt-step", "3"]])
def test_no_anchor_for_a_new_run_or_a_missing_checkpoint(tmp_path, extra):
    _save(tmp_path, SAMPLES, 5)
    args = _args(*SAMPLES, "--global-batch-size", "8", "--load", str(tmp_path), *extra)
    assert args.global_batch_anchor is None
    assert args.train_iters == 12  # 100 // 8 from sample 0


def test_no_anchor_where_the_record_cannot_tell(tmp_path):
    """A garbled record: no anchor; the load's check says what is wrong in one line."""
    _save(tmp_path, SAMPLES, 5)
    (tmp_path / "iter_0000005" / "run_args.json").write_text("{not json")
    assert _args(*SAMPLES, "--load", str(tmp_path)).global_batch_anchor is None


RAMPED = ["--train-samples", "500", "--global-batch-size", "64", "--rampup-batch-size", "16",
          "16", "200"]


def test_a_ramp_up_keeps_its_batch_size(tmp_path):
    """A ramp's sizes depend on --global-batch-size: resuming a ramp-up checkpoint with another
    one is refused in one line (no anchor on either side)."""
    _save(tmp_path, RAMPED, 9)
    other = _args(*RAMPED[:3], "32", *RAMPED[4:], "--load", str(tmp_path))
    assert other.global_batch_anchor is None
    with pytest.raises(CheckpointError) as err:
        check_run_args(str(tmp_path / "iter_0000009"), run_config(other))
    assert str(err.value).startswith("--load: the checkpoint was trained with "
                                     "--global-batch-size 64, this run has 32"), str(err.value)


def test_the_load_accepts_a_changed_batch_size_and_says_so(tmp_path):
    _save(tmp_path, SAMPLES, 5)
    run = run_config(_args(*SAMPLES, "--global-batch-size", "8", "--load", str(tmp_path)))
    folder = str(tmp_path / "iter_0000005")
    assert check_run_args(folder, run) is None
    assert data_position_note(folder, 5, run) == (
        "resuming the training data at sample 20, the checkpoint's consumed samples, with "
        "--global-batch-size 8 (the checkpoint's run trained 4)")


# --- the LR schedule's refusal names each side's units ----------------------------------------

def test_an_iteration_based_schedule_names_both_batch_sizes():
    """--lr-decay-iters 10 at batch 4 was 40 samples; at batch 8 it is 80: megatron-core's
    scheduler counts samples, so the resume is refused unless a flag says which side wins."""
    run = run_config(_args("--train-iters", "10", "--global-batch-size", "8"))
    scheduler = types.SimpleNamespace(**{attribute: 0 for attribute in (
        "max_lr", "min_lr", "lr_warmup_steps", "start_wd", "end_wd")},
        lr_decay_steps=80, lr_decay_style="linear", wd_incr_style="constant", wd_incr_steps=80)
    state = {**vars(scheduler), "lr_decay_steps": 40, "wd_incr_steps": 40}
    with pytest.raises(CheckpointError) as err:
        check_scheduler(state, scheduler, run, saved_batch_size=4)
    assert str(err.value).startswith(
        "--load: the checkpoint's schedule has --lr-decay-iters (default --train-iters) 10 x "
        "--global-batch-size 4, this run has 10 x 8; pass --override-opt_param-scheduler")
    overriding = dataclasses.replace(run, optimizer=dataclasses.replace(
        run.optimizer, override_opt_param_scheduler=True))
    check_scheduler(state, scheduler, overriding, saved_batch_size=4)
