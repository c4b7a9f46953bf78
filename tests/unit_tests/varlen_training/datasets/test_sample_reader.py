"""--num-workers only moves reads ahead: worker processes return exactly the samples, in the
order, that reading in the training process gives, across iterations and after a jump."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from megatron.varlen_training.datasets.sample_reader import SampleReader
from tests.harness.multirank import process_alive

BATCH = 3
REPO = Path(__file__).resolve().parents[4]


class _Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 30

    def __getitem__(self, idx):
        return {"tokens": torch.arange(idx, idx + 4) ** 2, "sample_id": idx, "pid": os.getpid()}


def _indices_of(iteration):
    return [iteration * BATCH + k for k in (2, 0, 1)]  # any order: the reader keeps it


def _reads(num_workers, iterations):
    reader = SampleReader(_Squares(), _indices_of, len(_Squares()) // BATCH, num_workers)
    return [reader.read(it) for it in iterations]


def test_workers_read_the_same_samples_in_the_same_order():
    iterations = [0, 1, 2, 5, 6, 3, 9]  # jumps forward and back restart the workers
    inline, ahead = _reads(0, iterations), _reads(2, iterations)
    for mine, theirs in zip(inline, ahead):
        assert [s["sample_id"] for s in mine] == [s["sample_id"] for s in theirs]
        assert all(torch.equal(a["tokens"], b["tokens"]) for a, b in zip(mine, theirs))
    assert {s["pid"] for batch in ahead for s in batch}.isdisjoint({os.getpid()})
    assert [s["sample_id"] for s in ahead[3]] == _indices_of(5)


# --- the workers never finalize the rank's garbage ------------------------------------------

class _Finalized:
    """Cyclic garbage (only a collection frees it) that notes which process finalizes it."""

    def __init__(self, path: Path):
        self.path, self.me = path, self

    def __del__(self):
        with open(self.path, "a") as handle:
            handle.write(f"{os.getpid()}\n")


class _Collecting(_Squares):
    """Each read collects the worker's garbage, as a worker's allocations may at any time."""

    def __getitem__(self, idx):
        gc.collect()
        return super().__getitem__(idx)


@pytest.mark.parametrize("frozen_before", [False, True], ids=["nothing_frozen", "some_frozen"])
def test_workers_never_finalize_the_ranks_garbage(tmp_path, frozen_before):
    """A rank's garbage from before the workers fork (in a run: a torn-down process group
    crashed a worker) is finalized in the rank, never in a worker; also where objects were
    frozen before (Python 3.12 starts so; so does a program that freezes after its imports)."""
    finalized = tmp_path / "finalized"
    was_enabled = gc.isenabled()
    gc.disable()  # the garbage outlives the fork unless the reader collects it
    try:
        if frozen_before:
            gc.freeze()
        _Finalized(finalized)
        reader = SampleReader(_Collecting(), _indices_of, len(_Squares()) // BATCH, 2)
        workers = {s["pid"] for s in reader.read(0)}
        reader.close()
    finally:
        if was_enabled:
            gc.enable()
    gc.collect()
    assert workers and os.getpid() not in workers
    assert finalized.read_text().split() == [str(os.getpid())]


# --- the workers stop when the run ends ----------------------------------------------------

WORKER_EXIT_S = 10.0


def _wait_until_gone(pids: set[int]) -> set[int]:
    deadline = time.monotonic() + WORKER_EXIT_S
    while any(process_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return {pid for pid in pids if process_alive(pid)}


def test_close_stops_the_workers_and_a_later_read_starts_new_ones():
    reader = SampleReader(_Squares(), _indices_of, len(_Squares()) // BATCH, num_workers=2)
    first = {s["pid"] for s in reader.read(0)}
    assert first and all(process_alive(pid) for pid in first)
    reader.close()
    assert not _wait_until_gone(first), "worker processes outlived close()"
    again = reader.read(1)  # reading after close starts workers again, at that iteration
    assert [s["sample_id"] for s in again] == _indices_of(1)
    reader.close()
    reader.close()  # idempotent
    assert not _wait_until_gone({s["pid"] for s in again})


# pretrain_gpt.py's path on indexed data with Megatron-LM's default 2 reader workers, as a
# 1-rank job in a process of its own that then leaves with os._exit, skipping finalizers, as the
# test harness's ranks do -- and, like them, with the forkserver start method (Python's default
# from 3.14), whose queues hold named semaphores (fork's are unlinked at once). Python's resource
# tracker reports, when that process ends, every named semaphore the run left behind (14 per
# rank; tools/benchmark_training.py ended with 336).
LEAK_PROBE = textwrap.dedent("""
    import multiprocessing, os, sys
    from megatron.varlen_training.config.from_flags import parse_run_config
    from megatron.varlen_training.pretrain import pretrain
    from megatron.varlen_training.trainer import Trainer
    from tests.unit_tests.varlen_training.datasets.indexed_corpus import write_corpus

    if __name__ == "__main__":
        multiprocessing.set_start_method("forkserver")
        prefix = sys.argv[1]
        write_corpus(prefix, 200, seed=1)
        argv = ["--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2",
                "--seq-length", "32", "--micro-batch-size", "1", "--global-batch-size", "4",
                "--lr", "1e-3", "--train-iters", "2", "--eval-iters", "0",
                "--tokenizer-type", "ByteLevelTokenizer", "--data-path", prefix,
                "--split", "100,0,0", "--num-workers", "2", "--sequence-packing"]
        trainer = Trainer(parse_run_config(argv, world_size=1))
        pretrain(trainer)
        trainer.close()
        print("trained", flush=True)
        os._exit(0)
""")


PROBE_TIMEOUT_S = 240
SESSION_END_S = 20.0  # the probe's helpers (forkserver, resource tracker) end after its exit


def _session_processes(session: int) -> list[int]:
    """Live (not zombie) processes of ``session``: the probe and whatever it started."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the process ended while we looked
        if int(fields[3]) == session and fields[0] != "Z":  # fields: state, ppid, pgrp, session
            alive.append(int(stat.parent.name))
    return alive


def test_a_run_with_reader_workers_leaks_no_semaphores(tmp_path):
    """Packed, as the benchmark's document rows (unpacked runs read through the same reader).
    The probe leads a session of its own: reader workers that outlive it fail the test (and
    are killed), they cannot hold the test up."""
    script, out, err = tmp_path / "probe.py", tmp_path / "out.txt", tmp_path / "err.txt"
    script.write_text(LEAK_PROBE)
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "corpus")],
                                stdout=stdout, stderr=stderr, cwd=REPO, start_new_session=True,
                                env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": ""})
    try:
        proc.wait(timeout=PROBE_TIMEOUT_S)
        deadline = time.monotonic() + SESSION_END_S
        while _session_processes(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = _session_processes(proc.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == 0 and out.read_text().splitlines()[-1:] == ["trained"], \
        err.read_text()[-3000:]
    assert not left, f"processes {left} of the run outlived it (reader workers not stopped)"
    assert "leaked" not in err.read_text(), err.read_text()[-3000:]
