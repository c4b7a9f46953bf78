"""A save that fails for an operational reason -- the disk fills up on
one rank, or Ctrl-C arrives -- ends the run with ONE line and a clean exit code (1 for a failed
save, 130 for Ctrl-C), the previous checkpoint stays the latest and no staging folder is left;
staging folders of killed saves are removed at the next save.

The faults are injected into the real entry point (save_fault_driver.py): writes raise ENOSPC
the way the kernel reports a full disk (in megatron-core's writer processes, or in this repo's
own writes), and the Ctrl-C is a real SIGINT to the process group, as a terminal sends it.
The runs whose fault is not timed start together, each test checking its own
(tests/unit_tests/background_runs.py).
"""

import contextlib
import functools
import os
import sys
from pathlib import Path

import pytest

from megatron.varlen_training.checkpoint import TRACKER_FILENAME
from tests.harness.multirank import run_distributed
from tests.harness.rendezvous import hosted_store
from tests.harness.training_runs import TINY_GPT_ARGS, train_on_this_rank
from tests.unit_tests.background_runs import BackgroundRuns, kill_tree, started_together

REPO = Path(__file__).resolve().parents[3]
DRIVER = Path(__file__).with_name("save_fault_driver.py")
PROG = "pretrain_gpt.py: error: "
ITERS = 4
RUN_DEADLINE_S = 180.0
BASE_ARGS = TINY_GPT_ARGS + ["--lr-decay-iters", str(ITERS)]
ARGS = BASE_ARGS + ["--train-iters", str(ITERS), "--save-interval", "2"]


# kind: (the rank the fault hits, ranks, extra flags). Rank 1 writes shards of its own only with
# the distributed optimizer (its half of the optimizer state); without it, rank 0 writes every
# replicated tensor.
FULL_DISK = {"full-disk-shards": (1, 2, ["--use-distributed-optimizer"]),
             "full-disk-after": (1, 2, [])}
PUBLISH = {"sigint-publish": (0, 1, [])}


def _start_driver(runs: BackgroundRuns, meeting: dict, kind: str, rank: int, world: int,
                  extra=()) -> None:
    """The driver on ``world`` plain rank processes ``{kind}-rank{r}`` (each its own session,
    as under a terminal's process group per rank), saving to ``runs.root/kind/ckpt``."""
    folder = runs.root / kind
    folder.mkdir()
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                   **meeting, PYTHONWARNINGS="ignore",
                   OMP_NUM_THREADS="1", SAVE_FAULT_NOTES=str(folder / "notes.txt"),
                   PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        runs.start(f"{kind}-rank{r}", [
            sys.executable, str(DRIVER), kind, str(rank), str(ITERS), "--", *ARGS, *extra,
            "--save", str(folder / "ckpt")], env=env, cwd=REPO, timeout_s=RUN_DEADLINE_S,
            merge_stderr=True, new_session=True)


def _driver_results(runs: BackgroundRuns, kind: str, world: int):
    """(exit codes, stdout+stderr per rank, checkpoint root) once every rank ended; each rank
    and any helper it spawned is killed after (none may outlive the test)."""
    runs.begin(kind)
    names = [f"{kind}-rank{r}" for r in range(world)]
    try:
        done = [runs[name].result() for name in names]
    finally:
        for name in names:
            kill_tree(runs[name].proc, new_session=True)
    return [d.returncode for d in done], [d.stdout for d in done], runs.root / kind / "ckpt"


@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    """The runs without a timed signal, started together (tests/unit_tests/background_runs.py);
    the ranks meet at stores the test hosts, as under torchrun."""
    with contextlib.ExitStack() as stores:
        def start(runs: BackgroundRuns, kind: str) -> None:
            rank, world, extra = {**FULL_DISK, **PUBLISH}[kind]
            _start_driver(runs, stores.enter_context(hosted_store()), kind, rank, world, extra)

        cases = {kind: functools.partial(start, kind=kind) for kind in {**FULL_DISK, **PUBLISH}}
        with started_together(tmp_path_factory.mktemp("faults"), cases) as runs:
            yield runs


def _error_lines(outputs) -> list[str]:
    return [line for out in outputs for line in out.splitlines() if PROG in line]


def _assert_previous_checkpoint_is_latest(root):
    assert (root / TRACKER_FILENAME).read_text() == "2"
    assert sorted(os.listdir(root)) == ["iter_0000002", TRACKER_FILENAME]  # no staging left


@pytest.mark.parametrize("kind", list(FULL_DISK))
def test_full_disk_on_one_rank_is_one_line(faults, kind):
    codes, outputs, root = _driver_results(faults, kind, world=2)
    assert codes == [1, 1], outputs
    assert not any("Traceback" in out for out in outputs), outputs
    assert _error_lines(outputs) == [
        f"{PROG}checkpoint iteration 4 was not saved to '{root}': No space left on device "
        f"[ENOSPC] on rank 1 (free space where --save points); the latest checkpoint is still "
        f"iteration 2; resume with --load {root}"], outputs
    _assert_previous_checkpoint_is_latest(root)


def test_ctrl_c_during_a_save_is_one_line(tmp_path):
    """Alone, not with the other runs: its Ctrl-C comes CTRL_C_DELAY_S after the writers start
    (save_fault_driver.py), a margin that more processes on the cores would shrink."""
    runs = BackgroundRuns(tmp_path)
    with hosted_store() as meeting:
        runs.add("sigint-shards", lambda runs: _start_driver(runs, meeting, "sigint-shards",
                                                             rank=0, world=1))
        codes, outputs, root = _driver_results(runs, "sigint-shards", world=1)
    assert codes == [130], outputs
    assert "Traceback" not in outputs[0] and "KeyboardInterrupt" not in outputs[0], outputs[0]
    assert (root.parent / "notes.txt").read_text() == "ignored"  # the main process reports it
    assert _error_lines(outputs) == [
        f"{PROG}checkpoint iteration 4 was not saved to '{root}': interrupted by Ctrl-C "
        f"(SIGINT); the latest checkpoint is still iteration 2; resume with --load {root}"]
    _assert_previous_checkpoint_is_latest(root)


def test_ctrl_c_while_publishing_completes_the_publication(faults):
    """Between the renames of the folder and the tracker, a Ctrl-C waits until both are done."""
    codes, outputs, root = _driver_results(faults, "sigint-publish", world=1)
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
