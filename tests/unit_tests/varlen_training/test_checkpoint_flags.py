"""Megatron-LM's checkpoint-format and save-mode flags (checkpoint_arguments.py) and the load of a
checkpoint in another format (checkpoint/format.py).

- ``--ckpt-step N`` loads iteration N, not the latest: with checkpoints at 2 and 4, a load of 2
  trains iterations 3 and 4 as the straight run does (and as the latest, 4, would not: its run
  is over); it needs no tracker file (without it, a load names the iterations there and
  --ckpt-step); an iteration not saved is one line listing those that are.
- ``--save`` == ``--load`` holding nothing yet (a restartable job's first launch) starts from
  scratch as Megatron-LM does, and the next launch resumes; with
  ``--exit-on-missing-checkpoint``, or a ``--load`` elsewhere, an empty folder stops the run.
- ``--save`` == ``--load`` at the iteration the folder holds saves that iteration again over
  itself; the rewritten checkpoint resumes as the straight run continues.
- a folder in Megatron-LM's other formats (legacy ``torch``, ``zarr``, plain
  ``torch.distributed.checkpoint``) or a ``torch_dist`` one that Megatron-LM saved (no
  ``manifest.json``, no ``run_args.json``) is refused in one line naming the format, before
  anything in it is read; this fork's own incomplete checkpoint keeps its own message.
- ``--ckpt-format`` other than torch_dist, ``--async-save`` and ``--non-persistent-*`` are
  refused in one line naming the flag and the way out (``--use-checkpoint-args`` without a
  checkpoint to load too; with one: test_use_checkpoint_args.py);
  ``--ckpt-format torch_dist``, ``--auto-detect-ckpt-format`` and ``--exit-on-missing-checkpoint``
  are accepted.

One 1-rank launch runs every training case (a few seconds of tiny runs).
"""

import json
import os
import shutil

import pytest
import torch

from megatron.varlen_training.checkpoint import TRACKER_FILENAME, checkpoint_dir
from megatron.varlen_training.checkpoint.format import check_saved_format
from megatron.varlen_training.checkpoint.integrity import staging_dir
from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.errors import CheckpointError
from megatron.varlen_training.flag_errors import ArgumentValidationError
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import TINY_GPT_ARGS, train_on_this_rank

LAUNCH_TIMEOUT_S = 240
BASE = TINY_GPT_ARGS + ["--train-iters", "4", "--lr-decay-iters", "4"]


def _losses_or_refusal(argv: list[str]) -> dict:
    try:
        return {"losses": [step["lm_loss"] for step in train_on_this_rank(argv)["history"]]}
    except CheckpointError as err:
        return {"refusal": str(err)}


def _legacy_folder(root) -> str:
    """A Megatron-LM ``--ckpt-format torch`` checkpoint: tracker, iter_0000002/mp_rank_00/."""
    os.makedirs(os.path.join(checkpoint_dir(root, 2), "mp_rank_00"))
    torch.save({"iteration": 2}, os.path.join(checkpoint_dir(root, 2), "mp_rank_00",
                                               "model_optim_rng.pt"))
    with open(os.path.join(root, TRACKER_FILENAME), "w") as tracker:
        tracker.write("2")
    return root


def _cases(folder: str) -> dict[str, dict]:
    """Saves at 2 and 4, the straight run, then the loads (in this order)."""
    saved, untracked = os.path.join(folder, "saved"), os.path.join(folder, "untracked")
    out = {"save": _losses_or_refusal(BASE + ["--save", saved, "--save-interval", "2"]),
           "straight": _losses_or_refusal(BASE)}
    shutil.copytree(checkpoint_dir(saved, 2), checkpoint_dir(untracked, 2))  # no tracker file
    # What a save killed before it was published leaves (its staging folder), complete-looking.
    shutil.copytree(checkpoint_dir(saved, 2), staging_dir(checkpoint_dir(saved, 3)))
    loads = {
        "step_2": ["--load", saved, "--ckpt-step", "2"],
        "latest": ["--load", saved],
        "untracked_step_2": ["--load", untracked, "--ckpt-step", "2"],
        "untracked": ["--load", untracked],
        "iteration_folder": ["--load", checkpoint_dir(saved, 2)],
        "step_3": ["--load", saved, "--ckpt-step", "3"],
        "legacy": ["--load", _legacy_folder(os.path.join(folder, "legacy"))],
    }
    out.update({name: _losses_or_refusal(BASE + argv) for name, argv in loads.items()})
    out["iteration_folder_root"] = checkpoint_dir(saved, 2)
    # --save == --load at the iteration it holds: nothing to train, iteration 4 saved again
    # over itself; a run resumed from the rewritten checkpoint continues as the straight run.
    out["resave"] = _losses_or_refusal(BASE + ["--load", saved, "--save", saved])
    five = ["--train-iters", "5"]
    out["after_resave"] = _losses_or_refusal(BASE + five + ["--load", saved])
    out["straight_5"] = _losses_or_refusal(BASE + five)
    out.update(_restartable_job(folder))
    return out


def _restartable_job(folder: str) -> dict[str, dict]:
    """--save and --load the same folder (Megatron-LM's restartable job): the first launch
    finds nothing there and starts from scratch, the second resumes; an empty --load that is
    not the --save folder, or any with --exit-on-missing-checkpoint, stops the run."""
    job, empty = os.path.join(folder, "job"), os.path.join(folder, "empty")
    os.makedirs(empty)
    same = ["--save", job, "--load", job]
    return {"job_first": _losses_or_refusal(BASE + same + ["--train-iters", "2"]),
            "job_second": _losses_or_refusal(BASE + same),
            "job_exit": _losses_or_refusal(BASE + ["--save", empty, "--load", empty,
                                                   "--exit-on-missing-checkpoint"]),
            "load_elsewhere": _losses_or_refusal(BASE + ["--save", job + "_2", "--load", empty])}


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict[str, dict]:
    folder = str(tmp_path_factory.mktemp("ckpt_flags"))
    return run_distributed(_cases, 1, args=(folder,), timeout_s=LAUNCH_TIMEOUT_S)[0]


def test_ckpt_step_loads_that_iteration(cases):
    straight = cases["straight"]["losses"]
    assert cases["save"]["losses"] == straight
    assert cases["step_2"]["losses"] == straight[2:], "iterations 3 and 4 from iteration 2"
    assert cases["latest"]["losses"] == [], "without --ckpt-step the latest (4): nothing left"


def test_ckpt_step_needs_no_tracker(cases):
    assert cases["untracked_step_2"]["losses"] == cases["straight"]["losses"][2:]


def test_save_over_the_loaded_iteration_resumes(cases):
    assert cases["resave"]["losses"] == []
    assert cases["after_resave"]["losses"] == cases["straight_5"]["losses"][4:]


def test_restartable_job_starts_then_resumes(cases):
    straight = cases["straight"]["losses"]
    assert cases["job_first"]["losses"] == straight[:2]
    assert cases["job_second"]["losses"] == straight[2:]


@pytest.mark.parametrize("case", ["job_exit", "load_elsewhere"])
def test_empty_load_stops_the_run(cases, case):
    assert "holds no checkpoint (latest_checkpointed_iteration.txt is missing)" in \
        cases[case]["refusal"], cases[case]


def test_untracked_folder_names_ckpt_step(cases):
    """A --load whose tracker file is gone (copied without it) stops in one line that names
    the iterations there and --ckpt-step."""
    refusal = cases["untracked"]["refusal"]
    assert "latest_checkpointed_iteration.txt is missing; it has iteration folders 2: pass " \
        "--ckpt-step N" in refusal, refusal


def test_iteration_folder_as_load_names_its_parent(cases):
    """--load iter_0000002 itself (a common slip): the line names the --load and --ckpt-step
    that load it."""
    refusal = cases["iteration_folder"]["refusal"]
    assert refusal.endswith("it is iteration folder 2: pass --load "
                            f"{os.path.dirname(cases['iteration_folder_root'])} --ckpt-step 2)"), \
        refusal


def test_ckpt_step_not_saved_is_one_line(cases):
    """Iteration 3 has only a killed save's staging folder: never loaded as a checkpoint."""
    refusal = cases["step_3"]["refusal"]
    assert "--ckpt-step 3" in refusal and "it has 2, 4" in refusal, refusal
    assert "\n" not in refusal


def test_legacy_checkpoint_is_one_line(cases):
    refusal = cases["legacy"]["refusal"]
    assert "Megatron-LM's --ckpt-format torch (legacy per-rank folders such as mp_rank_00/)" \
        in refusal, refusal
    assert "\n" not in refusal


def _config(folder, backend: str) -> None:
    with open(os.path.join(folder, "metadata.json"), "w") as out:
        json.dump({"sharded_backend": backend, "sharded_backend_version": 1}, out)


def test_other_formats_are_named(tmp_path):
    zarr = tmp_path / "zarr"
    zarr.mkdir()
    _config(zarr, "zarr")
    with pytest.raises(CheckpointError, match=r"--ckpt-format zarr \(metadata.json names"):
        check_saved_format(str(zarr))
    dcp = tmp_path / "dcp"
    dcp.mkdir()
    (dcp / ".metadata").write_bytes(b"")
    with pytest.raises(CheckpointError, match="--ckpt-format torch_dcp or fsdp_dtensor"):
        check_saved_format(str(dcp))
    megatron_lm = tmp_path / "megatron_lm"
    megatron_lm.mkdir()
    _config(megatron_lm, "torch_dist")
    with pytest.raises(CheckpointError, match="saved by Megatron-LM or another tool"):
        check_saved_format(str(megatron_lm))


def test_own_incomplete_checkpoint_keeps_its_message(tmp_path):
    """A torch_dist folder with this fork's run_args.json but no manifest: not another
    format (the loader then says the manifest is missing)."""
    _config(tmp_path, "torch_dist")
    (tmp_path / "run_args.json").write_text("{}")
    check_saved_format(str(tmp_path))


ARGS = TINY_GPT_ARGS + ["--train-iters", "2"]


@pytest.mark.parametrize("extra, words", [
    (["--ckpt-format", "torch"], "--ckpt-format torch is not supported"),
    (["--ckpt-format", "zarr"], "use --ckpt-format torch_dist"),
    (["--async-save"], "remove --async-save"),
    (["--non-persistent-save-interval", "5"], "use --save-interval instead"),
    (["--non-persistent-ckpt-type", "local"], "--non-persistent-ckpt-type local"),
    (["--use-checkpoint-args"], "nothing to load (pass --load or --pretrained-checkpoint)"),
    (["--ckpt-step", "2"], "nothing to load (pass --load)"),
])
def test_unsupported_flags_are_one_line(extra, words):
    with pytest.raises(ArgumentValidationError, match=None) as caught:
        parse_run_config(ARGS + extra, world_size=1)
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_restartable_job_load_may_not_exist_yet(tmp_path):
    job = str(tmp_path / "not_yet")
    parse_run_config(ARGS + ["--save", job, "--load", job], world_size=1)
    with pytest.raises(ArgumentValidationError, match="does not exist"):
        parse_run_config(ARGS + ["--load", str(tmp_path / "elsewhere")], world_size=1)


def test_accepted_flags(tmp_path):
    run = parse_run_config(ARGS + ["--ckpt-format", "torch_dist", "--auto-detect-ckpt-format",
                                   "--exit-on-missing-checkpoint", "--load", str(tmp_path),
                                   "--ckpt-step", "0"], world_size=1)
    assert run.checkpoint.ckpt_step == 0
