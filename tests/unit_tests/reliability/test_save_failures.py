"""A save that fails for an operational reason -- the disk fills up on
one rank, or Ctrl-C arrives -- ends the run with ONE line and a clean exit code (1 for a failed
save, 130 for Ctrl-C), the previous checkpoint stays the latest and no staging folder is left;
staging folders of killed saves are removed at the next save.

The faults are injected into the real entry point (save_fault_driver.py): writes raise ENOSPC
the way the kernel reports a full disk (in megatron-core's writer processes, or in this repo's
own writes), and the Ctrl-C is a real SIGINT to the process group, as a terminal sends it.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from megatron.varlen_training.checkpoint import TRACKER_FILENAME
from tests.harness.multirank import run_distributed
from tests.harness.rendezvous import hosted_store
from tests.harness.training_runs import TINY_GPT_ARGS, train_on_this_rank

REPO = Path(__file__).resolve().parents[3]
DRIVER = Path(__file__).with_name("save_fault_driver.py")
PROG = "pretrain_gpt.py: error: "
ITERS = 4
RUN_DEADLINE_S = 180.0
BASE_ARGS = TINY_GPT_ARGS + ["--lr-decay-iters", str(ITERS)]
ARGS = BASE_ARGS + ["--train-iters", str(ITERS), "--save-interval", "2"]


def _run_driver(tmp_path, kind: str, rank: int, world: int, extra=()):
    """Runs the driver on ``world`` plain rank processes (each its own session, as under a
    terminal's process group per rank); returns (exit codes, stdout+stderr per rank, root)."""
    root = tmp_path / "ckpt"
    with hosted_store() as meeting:  # the ranks meet at the test's store, as under torchrun
        return _run_ranks(kind, rank, world, extra, root, meeting)


def _run_ranks(kind: str, rank: int, world: int, extra, root, meeting):
    tmp_path = root.parent
    procs, logs = [], [tmp_path / f"rank{r}.log" for r in range(world)]
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                   **meeting, PYTHONWARNINGS="ignore",
                   OMP_NUM_THREADS="1", SAVE_FAULT_NOTES=str(tmp_path / "notes.txt"),
                   PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        with open(logs[r], "w") as log:
            procs.append(subprocess.Popen(
                [sys.executable, str(DRIVER), kind, str(rank), str(ITERS), "--", *ARGS,
                 *extra, "--save", str(root)],
                env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True))
    deadline = time.monotonic() + RUN_DEADLINE_S
    try:
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        for proc in procs:  # the rank and any helper it spawned; none may outlive the test
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)
    return [p.returncode for p in procs], [log.read_text() for log in logs], root


def _error_lines(outputs) -> list[str]:
    return [line for out in outputs for line in out.splitlines() if PROG in line]


def _assert_previous_checkpoint_is_latest(root):
    assert (root / TRACKER_FILENAME).read_text() == "2"
    assert sorted(os.listdir(root)) == ["iter_0000002", TRACKER_FILENAME]  # no staging left


# Rank 1 writes shards of its own only with the distributed optimizer (its half of the
# optimizer state); without it, rank 0 writes every replicated tensor.
@pytest.mark.parametrize("kind, extra", [("full-disk-shards", ["--use-distributed-optimizer"]),
                                         ("full-disk-after", [])])
def test_full_disk_on_one_rank_is_one_line(tmp_path, kind, extra):
    codes, outputs, root = _run_driver(tmp_path, kind, rank=1, world=2, extra=extra)
    assert codes == [1, 1], outputs
    assert not any("Traceback" in out for out in outputs), outputs
    assert _error_lines(outputs) == [
        f"{PROG}checkpoint iteration 4 was not saved to '{root}': No space left on device "
        f"[ENOSPC] on rank 1 (free space where --save points); the latest checkpoint is still "
        f"iteration 2; resume with --load {root}"], outputs
    _assert_previous_checkpoint_is_latest(root)


def test_ctrl_c_during_a_save_is_one_line(tmp_path):
    codes, outputs, root = _run_driver(tmp_path, "sigint-shards", rank=0, world=1)
    assert codes == [130], outputs
    assert "Traceback" not in outputs[0] and "KeyboardInterrupt" not in outputs[0], outputs[0]
    assert (tmp_path / "notes.txt").read_text() == "ignored"  # the main process reports it
    assert _error_lines(outputs) == [
        f"{PROG}checkpoint iteration 4 was not saved to '{root}': interrupted by Ctrl-C "
        f"(SIGINT); the latest checkpoint is still iteration 2; resume with --load {root}"]
    _assert_previous_checkpoint_is_latest(root)


def test_ctrl_c_while_publishing_completes_the_publication(tmp_path):
    """Between the renames of the folder and the tracker, a Ctrl-C waits until both are done."""
    codes, outputs, root = _run_driver(tmp_path, "sigint-publish", rank=0, world=1)
    assert codes == [130], outputs
    assert "Traceback" not in outputs[0], outputs[0]
    assert _error_lines(outputs) == [
        f"{PROG}interrupted by Ctrl-C (SIGINT) after checkpoint iteration 4 was saved to "
        f"'{root}': it is the latest checkpoint; resume with --load {root}"]
    assert (root / TRACKER_FILENAME).read_text() == "4"
    assert sorted(os.listdir(root)) == ["iter_0000002", "iter_0000004", TRACKER_FILENAME]


def test_stale_staging_folders_are_removed_at_the_next_save(tmp_path):
    root = tmp_path / "ckpt"
    for stale in (".iter_0000003.partial", ".iter_0000002.partial.old"):
        (root / stale / "rng").mkdir(parents=True)
        (root / stale / "rng" / "rank_00000.pt").write_bytes(b"left by a killed save")
    keep = root / ".iter_notes.partial"  # not a name a save uses: not ours to remove
    keep.mkdir()
    run_distributed(train_on_this_rank, 1, args=(BASE_ARGS + ["--train-iters", "2", "--save",
                                                              str(root)],), timeout_s=120)
    assert sorted(os.listdir(root)) == [keep.name, "iter_0000002", TRACKER_FILENAME]
