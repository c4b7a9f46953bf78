"""A bug in a flow's code while the facade converts a batch (megatron/wrap/batch.py), on one
rank: that rank keeps its traceback, the others stop promptly with one line naming it, with
either batch source. A plain ValueError from the flow's code is such a bug (only BatchError is
the user's batch); a bad batch stays a BatchError on every rank.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import torch

from megatron.varlen_training.errors import PeerRankError
from megatron.wrap.batch import global_batch
from megatron.wrap.flows.fields import BatchError, sample_error
from tests.harness.multirank import run_distributed

WORLD = 2
HANG_TIMEOUT_S = 20  # a rank left in the exchange would wait here: short, so a hang fails fast
RELEASE_WAIT_S = 60  # longer: only the peer leaving the exchange releases the failing rank
POLL_S = 0.05
MAX_LENGTH = 8


class _Flow:
    """Converts ``[n, ...]`` into samples of length n; rank ``failing_rank`` raises
    ``error`` instead (its own code's bug, or a bad sample)."""

    context = SimpleNamespace(max_length=MAX_LENGTH, max_length_key="seq_length")

    def __init__(self, failing_rank: int, error: Exception):
        self.failing_rank, self.error = failing_rank, error

    def extra_fields(self):  # the Flow interface the batch fingerprint reads
        return {}

    def build_samples(self, batch):
        if torch.distributed.get_rank() == self.failing_rank and self.error is not None:
            raise self.error
        ids = [torch.arange(n) for n in batch]
        return [{"tokens": t, "labels": t, "loss_mask": torch.ones(len(t)), "length": len(t)}
                for t in ids]


class _FlowWithoutLossMask(_Flow):
    """Rank ``failing_rank`` builds samples without a loss mask: the batch's fingerprint,
    taken in the same exchange, fails there (a KeyError)."""

    def build_samples(self, batch):
        samples = super().build_samples(batch)
        if torch.distributed.get_rank() == self.failing_rank:
            for sample in samples:
                del sample["loss_mask"]
        return samples


def _convert(source: str, failing_rank: int, error: Exception | None, release: str):
    flow = _Flow(failing_rank, error) if error is not None else \
        _FlowWithoutLossMask(failing_rank, error)
    try:
        samples = global_batch([3, 4], flow, source)
        return ("converted", [sample["length"] for sample in samples])
    except (PeerRankError, BatchError) as err:
        Path(release).touch()
        return ("one line", type(err).__name__, str(err))
    except Exception as err:  # noqa: BLE001 -- the flow's own bug, on its rank
        deadline = time.monotonic() + RELEASE_WAIT_S
        while not Path(release).exists() and time.monotonic() < deadline:
            time.sleep(POLL_S)
        return ("raised", type(err).__name__, str(err))


def _run(source: str, failing_rank: int, error: Exception, tmp_path):
    return run_distributed(_convert, WORLD, args=(source, failing_rank, error,
                                                  str(tmp_path / "released")),
                           timeout_s=HANG_TIMEOUT_S)


def test_a_flow_bug_on_rank_1_with_every_rank_passing_the_batch(tmp_path):
    assert _run("all_ranks", 1, ValueError("my tokenizer broke"), tmp_path) == [
        ("one line", "PeerRankError", "rank 1 raised ValueError: my tokenizer broke (a bug: its "
         "traceback is in rank 1's output; this rank stopped with it)"),
        ("raised", "ValueError", "my tokenizer broke")]


def test_a_flow_bug_on_rank_0_with_rank_0_passing_the_batch(tmp_path):
    assert _run("rank0", 0, KeyError("messages"), tmp_path) == [
        ("raised", "KeyError", "'messages'"),
        ("one line", "PeerRankError", "rank 0 raised KeyError: 'messages' (a bug: its "
         "traceback is in rank 0's output; this rank stopped with it)")]


def test_a_bug_in_the_fingerprint_is_shared_too(tmp_path):
    assert _run("all_ranks", 1, None, tmp_path) == [
        ("one line", "PeerRankError", "rank 1 raised KeyError: 'loss_mask' (a bug: its "
         "traceback is in rank 1's output; this rank stopped with it)"),
        ("raised", "KeyError", "'loss_mask'")]


def test_a_bad_sample_on_one_rank_is_a_batch_error_on_every_rank(tmp_path):
    bad = sample_error(1, "input_ids", "id 99 at position 1 is outside [0, 64)")
    assert _run("all_ranks", 1, bad, tmp_path) == [
        ("one line", "BatchError", str(bad))] * WORLD
    assert _run("rank0", 0, bad, tmp_path) == [("one line", "BatchError", str(bad))] * WORLD


def test_good_batches_convert_alike():
    assert run_distributed(_convert, WORLD, args=("all_ranks", -1, None, "unused"),
                           timeout_s=HANG_TIMEOUT_S) == [("converted", [3, 4])] * WORLD
