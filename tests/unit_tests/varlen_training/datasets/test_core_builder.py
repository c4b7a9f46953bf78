"""megatron-core's dataset builder on several ranks, with our turns instead of its barriers
(datasets/core_builder.py): a failure on one rank after the start-up checks ends every rank in
one line instead of leaving the others at a barrier, and the datasets are still megatron-core's,
built rank 0 first."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from megatron.core.datasets.blended_megatron_dataset_builder import (
    BlendedMegatronDatasetBuilder,
)
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
from megatron.core.datasets.utils import get_blend_from_list

from megatron.varlen_training.config import DataConfig
from megatron.varlen_training.datasets.indexed import build_indexed_datasets
from megatron.varlen_training.errors import PeerRankError, UserInputError
from megatron.varlen_training.tokenizer import BYTE_EOD, ByteLevelTokenizer
from tests.harness.multirank import run_distributed
from tests.unit_tests.varlen_training.datasets.indexed_corpus import write_corpus

SEQ_LENGTH, SEED, TRAIN, VALID = 32, 1234, 40, 8
WORLD = 2
RUN_TIMEOUT_S = 90  # a rank left at a barrier would wait here (10 minutes in a real run)
SAMPLES_COMPARED = 12


def _data(data_path: list[str], cache: str) -> DataConfig:
    return DataConfig(mock_data=False, sft=False, sft_mock_dataset_config_json=None,
                      tokenizer_type="ByteLevelTokenizer", tokenizer_model=None,
                      sft_messages_key="messages", sft_prompt_key="prompt",
                      sft_response_key="response", train_samples=TRAIN, eval_samples=VALID,
                      split="90,10,0", data_path=tuple(data_path), data_cache_path=cache)


def _build_or_error(data_path: list[str], cache: str):
    """This rank's first training samples' tokens, or the one-line error it stopped with."""
    try:
        train, _, _ = build_indexed_datasets(_data(data_path, cache), SEQ_LENGTH, SEED,
                                          ByteLevelTokenizer(), 1, True)
    except UserInputError as err:
        return str(err)
    return [train[i]["tokens"][:SEQ_LENGTH].tolist() for i in range(SAMPLES_COMPARED)]


def test_cache_write_failing_on_rank_0_ends_every_rank_in_one_line(tmp_path):
    """The cache path passes the start-up check (its nearest existing ancestor is a writable
    directory) but cannot be created: a dangling link, as to an unmounted share. Only rank 0
    writes the cache, so only rank 0 fails; rank 1 used to wait for it at megatron-core's
    barrier."""
    prefix = str(tmp_path / "corpus")
    write_corpus(prefix, 120, seed=1)
    cache = tmp_path / "cache"
    cache.symlink_to(tmp_path / "unmounted" / "share")
    results = run_distributed(_build_or_error, WORLD, args=([prefix], str(cache)),
                              timeout_s=RUN_TIMEOUT_S)
    expected = (f"rank 0: megatron-core could not build its datasets: [Errno 17] File exists: "
                f"'{cache}' (--data-cache-path must name a writable directory with free space)")
    assert results == [expected] * WORLD


class _Tokenizer:  # what megatron-core's datasets read of a tokenizer, written independently
    vocab_size, eod, pad = 261, BYTE_EOD, BYTE_EOD + 1
    unique_identifiers = {"class": "reference"}


def _megatron_core_reference(blend: list[str], cache: str):
    """megatron-core's own builder, barriers and all (as Megatron-LM's pretrain_gpt.py)."""
    config = GPTDatasetConfig(
        random_seed=SEED, sequence_length=SEQ_LENGTH, blend=get_blend_from_list(blend),
        split="90,10,0", path_to_cache=cache, tokenizer=_Tokenizer(),
        reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
        create_attention_mask=False)
    train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [TRAIN, VALID, 0], lambda: True,
                                                config).build()
    return [train[i]["tokens"].tolist() for i in range(SAMPLES_COMPARED)]


def _cache_files(folder) -> list[str]:
    """The cache's file names without their hash (which names the tokenizer too)."""
    return sorted(name.split("-", 1)[1] for name in os.listdir(folder))


def test_blend_built_in_rank_order_is_megatron_cores(tmp_path):
    """A weighted blend of two prefixes (megatron-core's threaded per-prefix path) on 2 ranks:
    every rank gets megatron-core's samples, and the cache holds megatron-core's files."""
    for name, seed in (("a", 1), ("b", 2)):
        write_corpus(str(tmp_path / name), 80, seed=seed)
    blend = ["0.7", str(tmp_path / "a"), "0.3", str(tmp_path / "b")]
    ours = run_distributed(_build_or_error, WORLD, args=(blend, str(tmp_path / "ours")),
                           timeout_s=RUN_TIMEOUT_S)
    [reference] = run_distributed(_megatron_core_reference, 1,
                                  args=(blend, str(tmp_path / "reference")),
                                  timeout_s=RUN_TIMEOUT_S)
    assert ours == [reference] * WORLD
    assert _cache_files(tmp_path / "ours") == _cache_files(tmp_path / "reference")
    assert torch.tensor(reference).shape == (SAMPLES_COMPARED, SEQ_LENGTH)


class _FailsOnRank1:
    """A builder whose build fails on rank 1 (reading the cache rank 0 wrote, say)."""

    def __init__(self, error: Exception):
        self.error = error

    def build(self):
        if torch.distributed.get_rank() == 1:
            raise self.error
        return ["train", "valid", None]


def _outcome(error: Exception):
    from megatron.varlen_training.datasets.core_builder import build_in_rank_order

    try:
        return ("built", build_in_rank_order(_FailsOnRank1(error)))
    except (UserInputError, PeerRankError) as err:
        return ("one line", str(err))
    except Exception as err:  # noqa: BLE001 -- a bug's own exception, kept on its rank
        return ("raised", type(err).__name__)


def test_failure_on_a_later_rank_stops_rank_0_too():
    """Rank 0 has built; rank 1 fails in its turn. An I/O error is one line on both ranks; a
    bug keeps its exception on rank 1, and rank 0 stops with the line naming it (the line of
    every bug errors.agree_on_errors shares, which this module's turns are built on)."""
    io_error = FileNotFoundError(2, "No such file or directory", "/cache/x-document_index.npy")
    assert run_distributed(_outcome, WORLD, args=(io_error,), timeout_s=RUN_TIMEOUT_S) == [
        ("one line", "rank 1: megatron-core could not build its datasets: [Errno 2] No such "
                     "file or directory: '/cache/x-document_index.npy' (--data-cache-path must "
                     "name a writable directory with free space)")] * WORLD
    bug = KeyError("split")
    assert run_distributed(_outcome, WORLD, args=(bug,), timeout_s=RUN_TIMEOUT_S) == [
        ("one line", "rank 1 raised KeyError: 'split' (a bug: its traceback is in rank 1's "
                     "output; this rank stopped with it)"),
        ("raised", "KeyError")]


HANG_TIMEOUT_S = 30  # what a rank left waiting would hit: short, so a hang fails fast
RELEASE_WAIT_S = 90  # longer than that: only rank 0 leaving the build releases rank 1
POLL_S = 0.05


def _index_bug(self):
    raise IndexError("index 40 is out of bounds for axis 0 with size 40")


def _build_with_a_bug_on_rank_1(data_path: list[str], cache: str, release: str):
    """megatron-core's builder (through build_indexed_datasets) with a bug in its GPTDataset on
    rank 1, which reads the cache after rank 0 wrote it. Rank 1 stays alive until rank 0 has
    left: the bug's rank exiting must not be what frees rank 0."""
    from megatron.core.datasets.gpt_dataset import GPTDataset

    if torch.distributed.get_rank() == 1:
        GPTDataset._build_document_sample_shuffle_indices = _index_bug
    try:
        return ("built", _build_or_error(data_path, cache))
    except PeerRankError as err:
        Path(release).touch()
        return ("one line", str(err))
    except IndexError as err:
        deadline = time.monotonic() + RELEASE_WAIT_S
        while not Path(release).exists() and time.monotonic() < deadline:
            time.sleep(POLL_S)
        return ("raised", type(err).__name__, err.__traceback__ is not None)


def test_a_bug_in_megatron_cores_builder_on_rank_1_ends_rank_0_in_one_line(tmp_path):
    prefix = str(tmp_path / "corpus")
    write_corpus(prefix, 120, seed=1)
    results = run_distributed(_build_with_a_bug_on_rank_1, WORLD,
                              args=([prefix], str(tmp_path / "cache"),
                                    str(tmp_path / "released")),
                              timeout_s=HANG_TIMEOUT_S)
    assert results == [
        ("one line", "rank 1 raised IndexError: index 40 is out of bounds for axis 0 with "
                     "size 40 (a bug: its traceback is in rank 1's output; this rank stopped "
                     "with it)"),
        ("raised", "IndexError", True)]
