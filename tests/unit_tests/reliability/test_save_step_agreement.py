"""The steps of a save agree across ranks through errors.agree_and_gather (checkpoint/save.py's
``_agree_on_save``): an I/O failure on one rank is the same one-line failure on every rank (the
save turns it into CheckpointSaveError); a bug on one rank keeps its traceback there and stops
the others promptly in one line (it used to re-raise before the exchange: a hang)."""

from __future__ import annotations

import errno
import time
from pathlib import Path

import torch

from megatron.varlen_training.errors import PeerRankError
from tests.harness.multirank import run_distributed

WORLD = 2
HANG_TIMEOUT_S = 20  # a rank left in the exchange would wait here: short, so a hang fails fast
RELEASE_WAIT_S = 60  # longer: only the peer leaving the exchange releases the failing rank
POLL_S = 0.05


def _write_shard(error: Exception | None) -> str:
    if error is not None and torch.distributed.get_rank() == 1:
        raise error
    return f"shard of rank {torch.distributed.get_rank()}"


def _save_step(error: Exception | None, release: str):
    from megatron.varlen_training.checkpoint.save import _agree_on_save, _IOFailure

    try:
        return ("saved", _agree_on_save(_write_shard, error))
    except (_IOFailure, PeerRankError) as err:
        Path(release).touch()
        return ("one line", type(err).__name__, str(err))
    except Exception as err:  # noqa: BLE001 -- this rank's own bug
        deadline = time.monotonic() + RELEASE_WAIT_S
        while not Path(release).exists() and time.monotonic() < deadline:
            time.sleep(POLL_S)
        return ("raised", type(err).__name__, str(err))


def _run(error, tmp_path):
    return run_distributed(_save_step, WORLD, args=(error, str(tmp_path / "released")),
                           timeout_s=HANG_TIMEOUT_S)


def test_results_are_gathered_in_rank_order(tmp_path):
    assert _run(None, tmp_path) == [("saved", ["shard of rank 0", "shard of rank 1"])] * WORLD


def test_a_full_disk_on_rank_1_is_one_line_on_every_rank(tmp_path):
    full = OSError(errno.ENOSPC, "No space left on device", "/ckpt/iter_2.partial/1.distcp")
    assert _run(full, tmp_path) == [
        ("one line", "_IOFailure", "No space left on device [ENOSPC] writing "
         "/ckpt/iter_2.partial/1.distcp on rank 1 (free space where --save points)")] * WORLD


def test_a_bug_on_rank_1_stops_rank_0_in_one_line(tmp_path):
    assert _run(KeyError("optimizer"), tmp_path) == [
        ("one line", "PeerRankError", "rank 1 raised KeyError: 'optimizer' (a bug: its "
         "traceback is in rank 1's output; this rank stopped with it)"),
        ("raised", "KeyError", "'optimizer'")]
