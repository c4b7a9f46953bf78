"""errors.agree_on_errors on several ranks: every rank takes part in the exchange whatever its
step raised. A bug stays a traceback on the rank that hit it and ends the others promptly in
one line naming it (it used to leave them waiting in the exchange); user errors are as before.
"""

from __future__ import annotations

import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest
import torch

from megatron.varlen_training.errors import (CheckpointError, PeerRankError, UserInputError,
                                              agree_on_errors)
from tests.harness.multirank import run_distributed
from tests.harness.rendezvous import hosted_store

REPO = Path(__file__).resolve().parents[3]
WORLD = 2
# A rank left in the exchange waits until this deadline (10 minutes in a real run): short, so
# that the hang this file guards against fails the test quickly.
HANG_TIMEOUT_S = 20
RELEASE_WAIT_S = 60  # longer than the deadline: only the peer leaving the exchange releases it
POLL_S = 0.05
BUG = KeyError("no such split")
USER_ERROR = ValueError("data.jsonl:3: invalid JSON")


def _buggy_step(failures: dict):
    """Raises this rank's entry of ``failures`` ({rank: exception}), else returns the rank."""
    rank = torch.distributed.get_rank()
    if rank in failures:
        raise failures[rank]
    return rank


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + RELEASE_WAIT_S
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(POLL_S)


def _agree(failures: dict, release: str):
    """What this rank's ``agree_on_errors`` did. A rank whose own step raised stays alive until
    another rank has left the exchange (``release``): a failed process that is slow to exit
    (NCCL peers are not freed by its exit) must not be what lets the others go."""
    try:
        return ("returned", agree_on_errors(_buggy_step, failures))
    except (UserInputError, CheckpointError, PeerRankError) as err:
        Path(release).touch()
        return ("one line", type(err).__name__, str(err), err.exit_code, err.reporting_rank)
    except Exception as err:  # noqa: BLE001 -- the rank's own bug, re-raised
        _wait_for(Path(release))
        text = "".join(traceback.format_exception(err))
        return ("raised", type(err).__name__, "in _buggy_step" in text)


def test_a_bug_on_rank_1_ends_rank_0_in_one_line_naming_it(tmp_path):
    results = run_distributed(_agree, WORLD, args=({1: BUG}, str(tmp_path / "released")),
                              timeout_s=HANG_TIMEOUT_S)
    assert results == [
        ("one line", "PeerRankError", "rank 1 raised KeyError: 'no such split' (a bug: its "
         "traceback is in rank 1's output; this rank stopped with it)", 1, 0),
        ("raised", "KeyError", True)]


def test_a_bug_on_rank_0_is_reported_by_rank_1(tmp_path):
    """Rank 0 shows the traceback; the line is printed by the lowest rank that raises it."""
    results = run_distributed(_agree, WORLD, args=({0: BUG}, str(tmp_path / "released")),
                              timeout_s=HANG_TIMEOUT_S)
    assert results == [
        ("raised", "KeyError", True),
        ("one line", "PeerRankError", "rank 0 raised KeyError: 'no such split' (a bug: its "
         "traceback is in rank 0's output; this rank stopped with it)", 1, 1)]


def test_a_user_error_is_what_the_other_ranks_report_beside_a_bug(tmp_path):
    """The user can act on the data error; the bug keeps its traceback on its own rank."""
    results = run_distributed(_agree, WORLD, args=({0: USER_ERROR, 1: BUG},
                                                   str(tmp_path / "released")),
                              timeout_s=HANG_TIMEOUT_S)
    assert results == [
        ("one line", "UserInputError", "data.jsonl:3: invalid JSON", 2, 0),
        ("raised", "KeyError", True)]


class _ShardWriteError(CheckpointError):
    """A one-line error's subclass (as the checkpoint package's CheckpointSaveError)."""


def test_user_errors_and_success_are_unchanged(tmp_path):
    release = str(tmp_path / "released")
    assert run_distributed(_agree, WORLD, args=({}, release), timeout_s=HANG_TIMEOUT_S) == [
        ("returned", 0), ("returned", 1)]
    assert run_distributed(_agree, WORLD, args=({1: USER_ERROR}, release),
                           timeout_s=HANG_TIMEOUT_S) == [
        ("one line", "UserInputError", "data.jsonl:3: invalid JSON", 2, 0)] * WORLD


def test_a_one_line_errors_subclass_keeps_its_class_on_every_rank(tmp_path):
    """The ranks exchange class names: every rank raises the subclass itself (a script that
    catches it sees it on every rank; its exit code is its own)."""
    error = _ShardWriteError("cannot write shard 3 of /ckpt/iter_0000002: disk full")
    assert run_distributed(_agree, WORLD, args=({1: error}, str(tmp_path / "released")),
                           timeout_s=HANG_TIMEOUT_S) == [
        ("one line", "_ShardWriteError", str(error), 2, 0)] * WORLD


def _agree_local_class(release: str):
    class LocalError(CheckpointError):  # no peer can look up a class local to a function
        pass

    return _agree({1: LocalError("shard 3 is truncated")}, release)


def test_a_class_peers_cannot_find_travels_as_its_one_line_base(tmp_path):
    """Every rank raises what it received, the failing rank too (as for every user error)."""
    assert run_distributed(_agree_local_class, WORLD, args=(str(tmp_path / "released"),),
                           timeout_s=HANG_TIMEOUT_S) == [
        ("one line", "CheckpointError", "shard 3 is truncated", 2, 0)] * WORLD


def test_a_bug_without_a_process_group_keeps_its_traceback():
    with pytest.raises(KeyError) as err:
        agree_on_errors(lambda: {}["split"])
    assert "<lambda>" in "".join(traceback.format_exception(err.value))


# --- through an entry point's error handling: what each rank prints, and its exit status ----

SCRIPT = """
import sys, torch
from megatron.varlen_training.errors import agree_on_errors, exit_on_user_errors

def load_shard(rank):
    if rank == int(sys.argv[1]):
        raise AssertionError("shard 7 has no index")

with exit_on_user_errors("tiny.py"):
    torch.distributed.init_process_group("gloo")
    agree_on_errors(load_shard, torch.distributed.get_rank())
"""


@pytest.mark.parametrize("bug_rank", [1, 0])
def test_entry_point_prints_the_line_once_and_the_traceback_on_the_failing_rank(tmp_path,
                                                                                bug_rank):
    script = tmp_path / "tiny.py"
    script.write_text(SCRIPT)
    with hosted_store() as meeting:
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
               "WORLD_SIZE": str(WORLD), "PYTHONWARNINGS": "ignore", **meeting}
        procs = [subprocess.Popen([sys.executable, str(script), str(bug_rank)],
                                  env={**env, "RANK": str(rank)}, stderr=subprocess.PIPE,
                                  text=True) for rank in range(WORLD)]
        try:
            stderrs = [proc.communicate(timeout=HANG_TIMEOUT_S * 3)[1] for proc in procs]
        finally:
            for proc in procs:
                proc.kill()
    other = 1 - bug_rank
    assert [proc.returncode for proc in procs] == [1, 1], stderrs
    assert stderrs[other].splitlines() == [
        f"tiny.py: error: rank {bug_rank} raised AssertionError: shard 7 has no index (a bug: "
        f"its traceback is in rank {bug_rank}'s output; this rank stopped with it)"]
    # torch.distributed's excepthook prefixes the failing rank's traceback with its rank.
    traceback_lines = [line.removeprefix(f"[rank{bug_rank}]: ")
                       for line in stderrs[bug_rank].splitlines()]
    assert traceback_lines[0] == "Traceback (most recent call last):", stderrs[bug_rank]
    assert any(line.endswith(", in load_shard") for line in traceback_lines)
    assert traceback_lines[-1] == "AssertionError: shard 7 has no index"
    assert "tiny.py: error" not in stderrs[bug_rank]

