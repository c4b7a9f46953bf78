"""--num-workers only moves reads ahead: worker processes return exactly the samples, in the
order, that reading in the training process gives, across iterations and after a jump."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import torch

from megatron.varlen_training.datasets.sample_reader import SampleReader

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


# --- the workers stop when the run ends ----------------------------------------------------

WORKER_EXIT_S = 10.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie has exited, merely not yet waited for
        return stat.read().split()[2] != "Z"


def _wait_until_gone(pids: set[int]) -> set[int]:
    deadline = time.monotonic() + WORKER_EXIT_S
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return {pid for pid in pids if _alive(pid)}


def test_close_stops_the_workers_and_a_later_read_starts_new_ones():
    reader = SampleReader(_Squares(), _indices_of, len(_Squares()) // BATCH, num_workers=2)
    first = {s["pid"] for s in reader.read(0)}
    assert first and all(_alive(pid) for pid in first)
    reader.close()
    assert not _wait_until_gone(first), "worker processes outlived close()"
    again = reader.read(1)  # reading after close starts workers again, at that iteration
    assert [s["sample_id"] for s in again] == _indices_of(1)
    reader.close()
    reader.close()  # idempotent
    assert not _wait_until_gone({s["pid"] for s in again})


# A run on indexed data with Megatron-LM's default 2 reader workers, on one harness rank (which
# leaves with os._exit, skipping finalizers), in a process of its own: Python's resource tracker
# reports, when that process ends, every named semaphore a rank left behind (one rank is enough:
# 14 each; tools/benchmark_training.py ended with 336 of them).
LEAK_PROBE = textwrap.dedent("""
    import sys
    from tests.harness.multirank import run_distributed
    from tests.harness.training_runs import train_on_this_rank
    from tests.unit_tests.varlen_training.datasets.indexed_corpus import write_corpus

    if __name__ == "__main__":
        prefix = sys.argv[1]
        write_corpus(prefix, 200, seed=1)
        argv = ["--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2",
                "--seq-length", "32", "--micro-batch-size", "1", "--global-batch-size", "4",
                "--lr", "1e-3", "--train-iters", "2", "--eval-iters", "0",
                "--tokenizer-type", "ByteLevelTokenizer", "--data-path", prefix,
                "--split", "100,0,0", "--num-workers", "2", *sys.argv[2:]]
        run_distributed(train_on_this_rank, 1, args=(argv,), timeout_s=120)
        print("trained")
""")


def test_a_run_with_reader_workers_leaks_no_semaphores(tmp_path):
    """Packed, as the benchmark's document rows (unpacked runs read through the same reader)."""
    script = tmp_path / "probe.py"
    script.write_text(LEAK_PROBE)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "corpus"),
                           "--sequence-packing"],
                          capture_output=True, text=True, timeout=240, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": ""})
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1:] == ["trained"], \
        proc.stderr[-3000:]
    assert "leaked" not in proc.stderr, proc.stderr[-3000:]
