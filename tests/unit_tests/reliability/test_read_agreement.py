"""A sample that fails only when read, on one rank, mid-run, stops every rank at that step.

Before read_agreement.py the failing rank left alone (a traceback, exit code 1: the chat
template's ValueError was not one of the entry points' one-line errors) and its peers waited in
the step's next collective until --distributed-timeout-minutes, or until torchrun's agent
killed them. Here the providers of pretrain_gpt.py run on 2 gloo ranks over a dataset whose
sample ``BAD_INDEX`` raises what ArrowSFTDataset raises for a row the chat template refuses;
only the rank that reads it at the second iteration fails the read. Every rank must raise the
same one-line error at that iteration (printed once, by the reader), quickly; a bug in a read
keeps its traceback on its rank and stops the others with PeerRankError.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from megatron.varlen_training.datasets.sample import make_sample

from tests.harness.multirank import run_distributed

WORLD = 2
GLOBAL_BATCH = 4
SEQ_LENGTH = 16
ITERATIONS = 3
FAILING_ITERATION = 1  # the second step: the first one ran, its collectives all matched
# A rank left waiting in a collective fails the test at this deadline (a real run: 10 minutes).
RUN_TIMEOUT_S = 30
# Time from the failed read to every rank's error (the agreement itself: milliseconds).
PROMPT_S = 5.0
TEMPLATE_ERROR = ("chats.parquet row 13: the tokenizer's chat template refuses this "
                  "conversation (content REFUSE is not allowed); fix the conversation or the "
                  "template (--tokenizer-model)")


class _RefusingDataset(torch.utils.data.Dataset):
    """Samples of ``SEQ_LENGTH`` tokens; reading index ``i`` of ``bad`` ({index: exception})
    raises ``bad[i]`` on ranks ``failing_ranks`` (all ranks that read it when None: a row
    refused wherever it is read)."""

    def __init__(self, bad: dict, failing_ranks=None):
        self.bad, self.failing_ranks = bad, failing_ranks

    def __len__(self) -> int:
        return GLOBAL_BATCH * ITERATIONS

    def __getitem__(self, index: int) -> dict:
        rank = torch.distributed.get_rank()
        if index in self.bad and (self.failing_ranks is None or rank in self.failing_ranks):
            raise self.bad[index]
        ids = np.arange(SEQ_LENGTH + 1, dtype=np.int64) + index
        return make_sample(ids, None, index, pad_id=0, padded_length=SEQ_LENGTH)


def _provider(packed: bool, dataset, num_workers: int, dynamic: bool):
    from megatron.varlen.packing import GlobalBatchPacker, PackingConfig
    from megatron.varlen_training.data import PackedBatchProvider, UnpackedBatchProvider

    if not packed:
        return UnpackedBatchProvider(dataset, GLOBAL_BATCH, 1, SEQ_LENGTH, num_workers)
    lookup = None
    scheduler = "dp_balanced"
    if dynamic:
        from megatron.varlen.platform.dynamic_cp_groups import initialize_dynamic_cp_groups
        from megatron.varlen.scheduling.groups import build_group_layout

        lookup = initialize_dynamic_cp_groups(build_group_layout(WORLD, 1, 1)).lookup
        scheduler = "default_dynamic_cp"
    config = PackingConfig(scheduler=scheduler, max_seqlen_per_rank=SEQ_LENGTH, pad_id=0)
    packer = GlobalBatchPacker(config, group_lookup=lookup)
    return PackedBatchProvider(dataset, GLOBAL_BATCH, packer, num_workers)


def _steps_on_this_rank(packed: bool, bad: dict, failing_ranks=None, pipeline: int = 1,
                        num_workers: int = 0, dynamic: bool = False):
    """What this rank's steps did over ``_RefusingDataset(bad, failing_ranks)``:
    ("trained", iterations) or ("raised", iteration, class name, message, exit code, reporting
    rank, seconds from the step's start)."""
    from megatron.core import parallel_state as ps
    from megatron.varlen.platform.dynamic_cp_groups import destroy_dynamic_cp_groups

    ps.initialize_model_parallel(pipeline_model_parallel_size=pipeline)
    provider = _provider(packed, _RefusingDataset(bad, failing_ranks), num_workers,
                         dynamic)
    try:
        for iteration in range(ITERATIONS):
            started = time.monotonic()
            try:
                provider.step_batches(iteration)
            except Exception as err:  # noqa: BLE001 -- what each rank raised is the result
                return ("raised", iteration, type(err).__name__, str(err),
                        getattr(err, "exit_code", None), getattr(err, "reporting_rank", 0),
                        time.monotonic() - started)
        return ("trained", ITERATIONS)
    finally:
        provider.close()
        destroy_dynamic_cp_groups()
        ps.destroy_model_parallel()


def _bad_index(packed: bool, reader: int) -> int:
    """The index that rank ``reader`` (DP rank) reads at FAILING_ITERATION: unpacked, Megatron's
    split of micro-batches of 1 (DP rank r takes every other sample); packed, its block."""
    first = FAILING_ITERATION * GLOBAL_BATCH
    return first + reader if not packed else first + reader * (GLOBAL_BATCH // WORLD)


def _refused_row_read_by(packed: bool, reader: int) -> dict:
    return {_bad_index(packed, reader): ValueError(TEMPLATE_ERROR)}


def _assert_every_rank_stopped_in_one_line(results, reader: int, message: str):
    for result in results:
        assert result[:6] == ("raised", FAILING_ITERATION, "UserInputError", message, 2,
                              reader), results
        assert result[6] < PROMPT_S, results


LAYOUTS = {  # name: (packed, dynamic CP)
    "unpacked": (False, False),
    "packed": (True, False),
    "dynamic_cp": (True, True),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_refused_row_on_one_rank_stops_every_rank_in_one_line(layout):
    packed, dynamic = LAYOUTS[layout]
    reader = 1
    results = run_distributed(
        _steps_on_this_rank, WORLD, args=(packed, _refused_row_read_by(packed, reader)),
        kwargs={"dynamic": dynamic}, timeout_s=RUN_TIMEOUT_S)
    _assert_every_rank_stopped_in_one_line(results, reader, TEMPLATE_ERROR)


def test_a_file_unreadable_on_one_rank_only_stops_both():
    """An indexed file read with --no-mmap-bin-files (every read opens the .bin, so reads
    agree: read_agreement.reads_can_fail) that became unreadable on one node: only rank 0 fails
    the read, rank 1 reads the same index fine (here DP 1 x PP 2: both stages read the
    replica's samples, the first stage alone fails, as a stage whose disk went away)."""
    error = OSError("corpus/stdlib_text_document.bin: [Errno 5] Input/output error")
    results = run_distributed(
        _steps_on_this_rank, WORLD, args=(False, {FAILING_ITERATION * GLOBAL_BATCH: error}),
        kwargs={"failing_ranks": (0,), "pipeline": 2}, timeout_s=RUN_TIMEOUT_S)
    _assert_every_rank_stopped_in_one_line(results, 0, str(error))


@pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
def test_a_refused_row_read_by_a_worker_is_the_same_one_line(packed):
    """--num-workers: DataLoader would re-raise the worker's error with its traceback written
    into the message; the line must be the row's line."""
    reader = 1
    results = run_distributed(
        _steps_on_this_rank, WORLD, args=(packed, _refused_row_read_by(packed, reader)),
        kwargs={"num_workers": 1}, timeout_s=RUN_TIMEOUT_S)
    _assert_every_rank_stopped_in_one_line(results, reader, TEMPLATE_ERROR)


def test_a_bug_in_a_read_keeps_its_traceback_and_stops_the_peer():
    bug = KeyError("sample_id")
    results = run_distributed(
        _steps_on_this_rank, WORLD, args=(True, {_bad_index(True, 1): bug}),
        timeout_s=RUN_TIMEOUT_S)
    assert results[1][:3] == ("raised", FAILING_ITERATION, "KeyError"), results
    assert results[0][:5] == (
        "raised", FAILING_ITERATION, "PeerRankError",
        "rank 1 raised KeyError: 'sample_id' (a bug: its traceback is in rank 1's output; this "
        "rank stopped with it)", 1), results


def test_good_reads_train_every_step():
    results = run_distributed(_steps_on_this_rank, WORLD, args=(True, {}),
                              timeout_s=RUN_TIMEOUT_S)
    assert results == [("trained", ITERATIONS)] * WORLD


def test_a_user_error_wins_over_a_lower_rank_bug_and_is_printed_by_its_reader():
    """Rank 0 hits a bug, rank 1 a refused row at the same step: rank 0 keeps its traceback,
    rank 1 raises the row's line and prints it (not rank 0, whose output is the traceback)."""
    bad = {_bad_index(True, 0): KeyError("sample_id"), **_refused_row_read_by(True, 1)}
    results = run_distributed(_steps_on_this_rank, WORLD, args=(True, bad),
                              timeout_s=RUN_TIMEOUT_S)
    assert results[0][:3] == ("raised", FAILING_ITERATION, "KeyError"), results
    assert results[1][:6] == ("raised", FAILING_ITERATION, "UserInputError", TEMPLATE_ERROR, 2,
                              1), results
