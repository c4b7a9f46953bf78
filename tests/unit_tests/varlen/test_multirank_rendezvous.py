"""Where ranks meet, without a port race: multi-rank tests flaked with "address already in use"
when the harness picked a free port and a rank bound it later (another process took it in
between). Now the launcher hosts the store on a port it already holds (tests/harness/
rendezvous.py), and a plain 1-rank run hosts its own on a port the OS picks."""

from __future__ import annotations

import contextlib
import errno
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

from tests.harness import multirank, rendezvous
from tests.harness.multirank import run_distributed

REPO = Path(__file__).resolve().parents[3]
CONCURRENT_RUNS = 4  # 8 rank processes at once on a 2-core machine: load, as in CI
ROUNDS = 2
RUN_TIMEOUT_S = 90
TORCH_DEFAULT_MASTER_PORT = 29500  # torch's and Megatron-LM's usual MASTER_PORT


def _rank_store_port() -> int:
    """The port of the c10d store this rank's default process group talks to."""
    store = torch.distributed.distributed_c10d._get_default_store()  # noqa: SLF001
    while hasattr(store, "underlying_store"):  # PrefixStore wrappers
        store = store.underlying_store
    return store.port


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex((rendezvous.LOOPBACK, port)) == 0


def test_ranks_join_the_store_the_launcher_already_holds(monkeypatch):
    """The port the ranks use is the launcher's, listening before any rank starts: nothing can
    take it in between."""
    held = []

    @contextlib.contextmanager
    def recording_store():
        with rendezvous.hosted_store() as meeting:
            port = int(meeting["MASTER_PORT"])
            held.append((port, _listening(port)))
            yield meeting

    monkeypatch.setattr(multirank, "hosted_store", recording_store)
    ports = run_distributed(_rank_store_port, 2, timeout_s=RUN_TIMEOUT_S)
    assert held and held[0][1], "the launcher did not hold a listening store before the ranks"
    assert ports == [held[0][0]] * 2


def _world_sum(offset: int) -> int:
    value = torch.tensor([torch.distributed.get_rank() + offset])
    torch.distributed.all_reduce(value)
    return int(value)


def test_concurrent_runs_never_collide():
    """Several multi-rank runs started at once (as parallel test sessions do), twice."""
    multirank._get_context()  # noqa: SLF001 -- start the forkserver once, before the threads
    results, errors = {}, []

    def launch(index: int) -> None:
        try:
            results[index] = run_distributed(_world_sum, 2, args=(index,),
                                             timeout_s=RUN_TIMEOUT_S)
        except Exception as err:  # noqa: BLE001 -- reported below, with every other failure
            errors.append(f"run {index}: {err}")

    for round_index in range(ROUNDS):
        threads = [threading.Thread(target=launch, args=(round_index * CONCURRENT_RUNS + i,))
                   for i in range(CONCURRENT_RUNS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert not errors, "\n".join(errors)
    # ranks 0 and 1 each add the run's offset: a run that met another run's ranks would not
    assert results == {i: [2 * i + 1] * 2 for i in range(ROUNDS * CONCURRENT_RUNS)}


# Twice in one process (the facade's tests do): the second run after the first's teardown.
ONE_RANK_RUN = textwrap.dedent("""
    import os, torch
    from megatron.varlen_training.initialize import initialize_distributed, shutdown
    for _ in range(2):
        initialize_distributed()
        value = torch.ones(1)
        torch.distributed.all_reduce(value)
        print(torch.distributed.get_world_size(), int(value), "MASTER_PORT" in os.environ)
        shutdown()
""")


@contextlib.contextmanager
def _port_busy(port: int):
    """Holds ``port`` (listening) for the block, unless another process already does."""
    with socket.socket() as holder:
        # as a store binds: over a connection of an ended run still in TIME_WAIT
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            holder.bind((rendezvous.LOOPBACK, port))
            holder.listen()
        except OSError as err:
            if err.errno != errno.EADDRINUSE:
                raise
        yield


def test_plain_one_rank_run_needs_no_free_master_port():
    """A plain ``python pretrain_gpt.py`` (no RANK) is a 1-rank job: it must start while
    torch's default MASTER_PORT is taken (two such runs on one machine used to collide)."""
    with _port_busy(TORCH_DEFAULT_MASTER_PORT):
        proc = subprocess.run([sys.executable, "-c", ONE_RANK_RUN], capture_output=True,
                              text=True, timeout=120, cwd=REPO,
                              env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO),
                                   "PYTHONWARNINGS": "ignore", "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["1", "1", "False"] * 2


@pytest.mark.parametrize("init_method", ["env://", "tcp://"])
def test_ranks_of_a_hosted_store_do_not_bind_its_port(init_method):
    """torch's own reading of TORCHELASTIC_USE_AGENT_STORE: with it, rank 0 is a client of
    the launcher's store (without it, rank 0 would try to bind the port, which is taken)."""
    with rendezvous.hosted_store() as meeting:
        url = (init_method if init_method == "env://"
               else f"tcp://{meeting['MASTER_ADDR']}:{meeting['MASTER_PORT']}")
        code = textwrap.dedent(f"""
            import torch
            torch.distributed.init_process_group("gloo", init_method={url!r}, rank=0,
                                                 world_size=1)
            print("joined")
        """)
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=120, env={"PATH": "/usr/bin:/bin", **meeting,
                                                "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0 and proc.stdout.split() == ["joined"], proc.stderr[-3000:]
