"""Fault injection: SIGKILL one of 2 ranks mid-step or inside a save. The other rank
must exit by itself within seconds (gloo reports the closed connection; no collective waits
out its timeout), the newest published checkpoint must be complete, and resuming from it must
reproduce the uninterrupted run bit for bit (dropout 0.1 included).

Ranks are plain processes (RANK/WORLD_SIZE env, no torchrun, whose agent would kill the
survivor itself and hide a hang). Each rank leads its own session, so the checkpoint writer
helpers it spawned are reaped with it. ``FAULT_INJECTION_REPEATS=3`` runs every case 3 times.
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
from tests.harness.training_runs import TINY_GPT_ARGS, loss_owner_history, train_on_this_rank

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


def _launch(kind, rank, iteration, argv, logs: Path, meeting: dict):
    procs = []
    for r in range(WORLD):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(r),
                   **meeting, PYTHONWARNINGS="ignore",
                   OMP_NUM_THREADS="1")
        with open(logs / f"rank{r}.log", "w") as log:
            procs.append(subprocess.Popen(
                [sys.executable, str(DRIVER), kind, str(rank), str(iteration), "--", *argv],
                env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True))
    return procs


def _wait(procs, killed: int) -> float:
    """Seconds the survivors took to exit after the killed rank died (all reaped after)."""
    deadline = time.monotonic() + LAUNCH_DEADLINE_S
    died_at = None
    try:
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if died_at is None and procs[killed].poll() is not None:
                died_at = time.monotonic()
            time.sleep(0.05)
        if died_at is None and procs[killed].poll() is not None:
            died_at = time.monotonic()
        return (time.monotonic() - died_at) if died_at is not None else float("inf")
    finally:
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the rank and any helper it spawned
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)


@pytest.mark.parametrize("repeat", range(REPEATS))
@pytest.mark.parametrize("kind, rank, iteration, latest", CASES,
                         ids=[f"kill_rank{c[1]}_{c[0]}_{c[2]}" for c in CASES])
def test_kill_one_rank(tmp_path, straight, kind, rank, iteration, latest, repeat):
    root = tmp_path / "ckpt"
    argv = ARGS + ["--train-iters", str(ITERS), "--save", str(root), "--save-interval", "2"]
    with hosted_store() as meeting:  # the ranks meet at the test's store, as under torchrun
        procs = _launch(kind, rank, iteration, argv, tmp_path, meeting)
        waited = _wait(procs, rank)
    logs = {r: (tmp_path / f"rank{r}.log").read_text() for r in range(WORLD)}
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
