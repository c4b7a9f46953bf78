"""Fault injection: SIGKILL one of 2 ranks mid-step or inside a save. The other rank
must exit by itself within seconds (gloo reports the closed connection; no collective waits
out its timeout), the newest published checkpoint must be complete, and resuming from it must
reproduce the uninterrupted run bit for bit (dropout 0.1 included).

Ranks are plain processes (RANK/WORLD_SIZE env, no torchrun, whose agent would kill the
survivor itself and hide a hang). Each rank leads its own session, so the checkpoint writer
helpers it spawned are reaped with it. ``FAULT_INJECTION_REPEATS=3`` runs every case 3 times.
A repeat's cases start together, each test checking its own (tests/unit_tests/background_runs.py;
each rank's exit time is noted as it happens).
"""

import contextlib
import os
import signal
import sys
from pathlib import Path

import pytest

from megatron.varlen_training.checkpoint import TRACKER_FILENAME
from tests.harness.multirank import run_distributed
from tests.harness.rendezvous import hosted_store
from tests.harness.training_runs import TINY_GPT_ARGS, loss_owner_history, train_on_this_rank
from tests.unit_tests.background_runs import BackgroundRuns, kill_tree

REPO = Path(__file__).resolve().parents[3]
DRIVER = Path(__file__).with_name("fault_driver.py")
WORLD = 2
ITERS = 6
SURVIVOR_EXIT_S = 30.0  # generous for a loaded 2-core machine; gloo itself reports in ~1-3 s
LAUNCH_DEADLINE_S = 180.0
ARGS = [a for i, a in enumerate(TINY_GPT_ARGS)  # default dropout (0.1): RNG states must resume
        if a not in ("--hidden-dropout", "--attention-dropout")
        and TINY_GPT_ARGS[i - 1] not in ("--hidden-dropout", "--attention-dropout")]
ARGS += ["--lr-decay-iters", str(ITERS), "--global-batch-size", "4", "--micro-batch-size", "2"]
REPEATS = int(os.environ.get("FAULT_INJECTION_REPEATS", "1"))
# (what, rank killed, iteration, checkpoint left as latest; saves every 2 iterations)
ALL_CASES = [("step", 1, 3, 2), ("save", 1, 4, 2), ("save", 0, 4, 2)]
# The default suite runs one kill mid-step and one inside a save (of rank 0, which writes the
# checkpoint's tracker file); repeated runs take every case.
CASES = ALL_CASES if REPEATS > 1 else [ALL_CASES[0], ALL_CASES[2]]


@pytest.fixture(scope="module")
def straight():
    runs = run_distributed(train_on_this_rank, WORLD, args=(ARGS + ["--train-iters",
                                                                    str(ITERS)],),
                           timeout_s=240)
    return [h["lm_loss"] for h in loss_owner_history(runs)]


def _case_id(case, repeat: int) -> str:
    kind, rank, iteration, _ = case
    return f"kill_rank{rank}_{kind}_{iteration}-{repeat}"


def _launch(runs: BackgroundRuns, case, repeat: int, meeting: dict) -> None:
    """Ranks ``{case id}-rank{r}`` of one case, saving to ``runs.root/{case id}/ckpt``."""
    kind, rank, iteration, _ = case
    folder = runs.root / _case_id(case, repeat)
    argv = ARGS + ["--train-iters", str(ITERS), "--save", str(folder / "ckpt"),
                   "--save-interval", "2"]
    for r in range(WORLD):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(r),
                   **meeting, PYTHONWARNINGS="ignore",
                   OMP_NUM_THREADS="1")
        runs.start(f"{_case_id(case, repeat)}-rank{r}", [
            sys.executable, str(DRIVER), kind, str(rank), str(iteration), "--", *argv],
            env=env, cwd=REPO, timeout_s=LAUNCH_DEADLINE_S, merge_stderr=True,
            new_session=True)


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """Every case's ranks, one repeat's cases started together when the first test of that
    repeat asks (tests/unit_tests/background_runs.py); the ranks meet at stores the test
    hosts, as under torchrun. Returns ``runs(repeat)``."""
    groups: dict[int, BackgroundRuns] = {}
    with contextlib.ExitStack() as stores:
        def runs(repeat: int) -> BackgroundRuns:
            if repeat not in groups:
                groups[repeat] = BackgroundRuns(tmp_path_factory.mktemp(f"repeat{repeat}"))
                for case in CASES:
                    _launch(groups[repeat], case, repeat, stores.enter_context(hosted_store()))
            return groups[repeat]

        try:
            yield runs
        finally:
            for group in groups.values():
                group.kill_all()


def _wait(runs: BackgroundRuns, case_id: str, killed: int):
    """Each rank's log, and the seconds the survivors took to exit after the killed rank died
    (every rank and its helpers are killed after)."""
    ranks = [runs[f"{case_id}-rank{r}"] for r in range(WORLD)]
    try:
        logs = {r: rank.result().stdout for r, rank in enumerate(ranks)}
    finally:
        for rank in ranks:
            kill_tree(rank.proc, new_session=True)
    survivors_ended = max(rank.ended_at for r, rank in enumerate(ranks) if r != killed)
    return logs, survivors_ended - ranks[killed].ended_at


@pytest.mark.parametrize("repeat", range(REPEATS))
@pytest.mark.parametrize("kind, rank, iteration, latest", CASES,
                         ids=[f"kill_rank{c[1]}_{c[0]}_{c[2]}" for c in CASES])
def test_kill_one_rank(launched, straight, kind, rank, iteration, latest, repeat):
    runs = launched(repeat)
    case_id = _case_id((kind, rank, iteration, latest), repeat)
    root = runs.root / case_id / "ckpt"
    logs, waited = _wait(runs, case_id, rank)
    procs = [runs[f"{case_id}-rank{r}"].proc for r in range(WORLD)]
    assert procs[rank].returncode == -signal.SIGKILL, logs[rank][-2000:]
    survivor = 1 - rank
    assert waited < SURVIVOR_EXIT_S, f"rank {survivor} still running {waited:.1f} s after"
    assert procs[survivor].returncode == 1, logs[survivor][-2000:]
    assert "Traceback" not in logs[survivor], logs[survivor][-2000:]
    assert f"pretrain_gpt.py: error: rank {survivor} lost a peer rank" in logs[survivor]
    assert (root / TRACKER_FILENAME).read_text() == str(latest)
    assert not (root / f"iter_{iteration:07d}").exists()  # a killed save is never published
    resumed = run_distributed(train_on_this_rank, WORLD, args=(ARGS + [
        "--train-iters", str(ITERS), "--load", str(root)],), timeout_s=240)
    got = [h["lm_loss"] for h in loss_owner_history(resumed)]
    assert got == straight[latest:], f"resumed {got} != straight {straight[latest:]}"
