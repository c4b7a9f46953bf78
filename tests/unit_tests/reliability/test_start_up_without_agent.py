"""A run started without torchrun's agent (as under srun, or a plain ``python pretrain_gpt.py``
per rank: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set, rank 0 hosting the store) where one
rank's flags fail at start-up: every rank ends promptly with the one line, printed once, exit
code 2 (megatron/varlen_training/process_group.py). Before, the other rank waited in
``init_process_group`` until the timeout, then printed a traceback, and the line was lost
whenever the failing rank was not rank 0.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from megatron.varlen_training import process_group
from tests.harness.training_runs import TINY_GPT_ARGS

REPO = Path(__file__).resolve().parents[3]
WORLD = 2
# The healthy rank would wait this long for its peer (the hang this file guards against) ...
HEALTHY_RANK_TIMEOUT_MINUTES = "5"
# ... and the test gives both ranks this long: process start-up (about 30 s on a loaded 2-core
# machine), then the agreement, which takes well under a second.
RUN_DEADLINE_S = 150
# pretrain_mamba.py's flags on top of the tiny GPT's (a Mamba layer, then attention).
TINY_HYBRID_ARGS = ["--hybrid-override-pattern", "M*", "--mamba-head-dim", "8",
                    "--mamba-num-groups", "2"]
IMPORT_DEADLINE_S = 120


def _free_port() -> int:
    # Rank 0 binds MASTER_PORT itself (no launcher holds it): a port free a moment ago.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _start_ranks(bad_rank: int, blocker: Path) -> list[subprocess.Popen]:
    port = _free_port()
    procs = []
    for rank in range(WORLD):
        save = [] if rank != bad_rank else ["--save", str(blocker / "ckpt")]
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore",
               "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "RANK": str(rank),
               "LOCAL_RANK": str(rank), "WORLD_SIZE": str(WORLD), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen(
            [sys.executable, "pretrain_gpt.py", *TINY_GPT_ARGS, "--train-iters", "2",
             "--distributed-timeout-minutes", HEALTHY_RANK_TIMEOUT_MINUTES, *save],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def _finish(procs: list[subprocess.Popen]) -> list[str]:
    try:
        return [proc.communicate(timeout=RUN_DEADLINE_S)[1] for proc in procs]
    finally:
        for proc in procs:
            proc.kill()  # a rank still waiting for its peer (the failure this test catches)
            proc.wait()


@pytest.mark.parametrize("bad_rank", [1, 0])
def test_a_bad_flag_on_one_rank_ends_every_rank_in_one_line(tmp_path, bad_rank):
    """``--save`` below a file on one rank only (as a node whose disk differs)."""
    blocker = tmp_path / "a_file"
    blocker.write_text("x")  # a path below a file cannot be created, even by root
    procs = _start_ranks(bad_rank, blocker)
    stderrs = _finish(procs)
    assert [proc.returncode for proc in procs] == [2] * WORLD, stderrs
    lines = [[line for line in stderr.splitlines() if line.strip()] for stderr in stderrs]
    assert lines == [[f"pretrain_gpt.py: error: --save directory '{blocker}/ckpt' is not "
                      f"writable (Not a directory); checked at start-up so no training is "
                      f"lost at the first save"], []]


@pytest.mark.parametrize("environment, waiting", [
    ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}, True),
    ({"RANK": "1", "WORLD_SIZE": "2"}, False),  # no meeting place: nobody can be waiting
    ({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}, False),
    ({}, False),  # a plain one-process run
])
def test_who_has_peers_waiting(monkeypatch, environment, waiting):
    for name in process_group.LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert process_group.has_peers_waiting() is waiting
    assert os.environ.get("RANK") == environment.get("RANK")


RUN_LENGTH = ["--train-iters", "2"]
# entry point: (flags, whether megatron-core is imported at the join). Both join before the
# training layer (megatron.varlen_training.pretrain: the model, megatron-core's schedules and
# optimizer); pretrain_mamba.py's flags themselves use megatron-core's hybrid layer allocation
# (hybrid_arguments.py), so it has megatron-core by then. In this order: one interpreter runs
# both, the imports of the first are there for the second.
ENTRY_POINTS = {"pretrain_gpt.py": (TINY_GPT_ARGS + RUN_LENGTH, False),
                "pretrain_mamba.py": (TINY_GPT_ARGS + RUN_LENGTH + TINY_HYBRID_ARGS, True)}
HEAVY_MODULES = ["megatron.core", "megatron.varlen_training.pretrain"]


def test_a_rank_with_peers_joins_them_before_importing_the_training_layer():
    """The healthy rank's side of the agreement above: each entry point reaches the call that
    joins the process group (replaced by one that stops the entry point) before the imports
    of its training layer."""
    code = (f"import json, runpy, sys, torch.distributed\n"
            f"class Joined(Exception):\n    pass\n"
            f"def join(*args, **kwargs):\n    raise Joined\n"
            f"torch.distributed.init_process_group = join\n"
            f"for entry_point, (flags, _) in {ENTRY_POINTS!r}.items():\n"
            f"    sys.argv = [entry_point, *flags]\n"
            f"    try:\n"
            f"        runpy.run_path(entry_point, run_name='__main__')\n"
            f"    except Joined:\n"
            f"        print(json.dumps([m in sys.modules for m in {HEAVY_MODULES!r}]))\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore",
           "CUDA_VISIBLE_DEVICES": "", "RANK": "1", "WORLD_SIZE": str(WORLD),
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=IMPORT_DEADLINE_S)
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line) for line in proc.stdout.splitlines()] == [
        [core, False] for _, core in ENTRY_POINTS.values()], proc.stderr


# Ctrl-C must end a rank waiting for its peers at once; without the join's own thread it ended
# only at --distributed-timeout-minutes (Python hears a signal between bytecodes, never inside
# the store's C++ wait).
INTERRUPT_DEADLINE_S = 30
LISTEN_POLL_S = 0.2


def _wait_until_listening(port: int, proc: subprocess.Popen) -> None:
    """Rank 0 hosts the store: once its port takes connections, rank 0 waits for rank 1."""
    deadline = time.monotonic() + IMPORT_DEADLINE_S
    while time.monotonic() < deadline and proc.poll() is None:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(LISTEN_POLL_S)
    raise AssertionError(f"rank 0 never hosted the store (exit {proc.poll()})")


def test_ctrl_c_while_waiting_for_peers_ends_at_once_in_one_line():
    port = _free_port()
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore",
           "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "RANK": "0", "LOCAL_RANK": "0",
           "WORLD_SIZE": str(WORLD), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    proc = subprocess.Popen(
        [sys.executable, "pretrain_gpt.py", *TINY_GPT_ARGS, *RUN_LENGTH,
         "--distributed-timeout-minutes", HEALTHY_RANK_TIMEOUT_MINUTES],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_until_listening(port, proc)
        proc.send_signal(signal.SIGINT)
        stderr = proc.communicate(timeout=INTERRUPT_DEADLINE_S)[1]
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, stderr
    assert [line for line in stderr.splitlines() if line.strip()] == [
        "pretrain_gpt.py: error: interrupted by Ctrl-C (SIGINT) while rank 0 waited for the "
        "other ranks of the job (WORLD_SIZE 2) to join: nothing ran yet"]
