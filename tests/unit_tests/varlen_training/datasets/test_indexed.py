"""Indexed data (--data-path PREFIX ...): the sample stream is megatron-core's GPTDataset's,
built by the test itself from the same seed, split and blend; blends follow their weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from megatron.core.datasets.blended_megatron_dataset_builder import (
    BlendedMegatronDatasetBuilder,
)
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

from megatron.varlen_training.config import DataConfig
from megatron.varlen_training.datasets.indexed import build_indexed_datasets
from megatron.varlen_training.tokenizer import BYTE_EOD, ByteLevelTokenizer
from tests.harness.multirank import run_distributed
from tests.unit_tests.varlen_training.datasets.indexed_corpus import write_corpus

SEQ_LENGTH = 32
SEED = 1234


class _Tokenizer:  # what megatron-core's datasets read of a tokenizer, written independently
    vocab_size, eod, pad = 261, BYTE_EOD, BYTE_EOD + 1
    unique_identifiers = {"class": "reference"}


def _data(data_path=None, split="90,10,0", train=40, valid=8, test=0, **paths) -> DataConfig:
    return DataConfig(mock_data=False, sft=False, sft_mock_dataset_config_json=None,
                      tokenizer_type="ByteLevelTokenizer", tokenizer_model=None,
                      sft_messages_key="messages", sft_prompt_key="prompt",
                      sft_response_key="response",
                      train_samples=train, eval_samples=valid, test_samples=test, split=split,
                      data_path=tuple(data_path) if data_path else None, **paths)


def _reference(blend, split, sizes, cache, blend_per_split=None):
    """megatron-core used directly (Megatron-LM's pretrain_gpt.py does the same)."""
    config = GPTDatasetConfig(
        random_seed=SEED, sequence_length=SEQ_LENGTH, blend=blend, split=split,
        blend_per_split=blend_per_split, path_to_cache=cache, tokenizer=_Tokenizer(),
        reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
        create_attention_mask=False)
    return BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()


def _ours(data, pad_to_seq_length=True, multiple=1):
    """Our (train, validation) datasets."""
    return _ours_with_test(data, pad_to_seq_length, multiple)[:2]


def _ours_with_test(data, pad_to_seq_length=True, multiple=1):
    return build_indexed_datasets(data, SEQ_LENGTH, SEED, ByteLevelTokenizer(), multiple,
                                  pad_to_seq_length)


@pytest.fixture(autouse=True)
def one_rank(tmp_path):
    """megatron-core's BlendedDataset asks torch.distributed for the rank: a one-rank group."""
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path}/store",
                                         rank=0, world_size=1)
    yield
    torch.distributed.destroy_process_group()


@pytest.fixture
def corpora(tmp_path):
    write_corpus(str(tmp_path / "a"), 120, seed=1)
    write_corpus(str(tmp_path / "b"), 60, seed=2)
    return str(tmp_path / "a"), str(tmp_path / "b")


def _assert_same_stream(ours, reference, count):
    for i in range(count):
        sample, expected = ours[i], reference[i]
        assert sample["sample_id"] == i
        assert sample["length"] == SEQ_LENGTH
        assert torch.equal(sample["tokens"][:SEQ_LENGTH], expected["tokens"]), i
        assert torch.equal(sample["labels"][:SEQ_LENGTH], expected["labels"]), i
        assert torch.equal(sample["loss_mask"][:SEQ_LENGTH], expected["loss_mask"]), i


def test_single_prefix_stream_is_gpt_datasets(corpora, tmp_path):
    a, _ = corpora
    train, valid = _ours(_data([a]))
    ref_train, ref_valid, _ = _reference(([a], None), "90,10,0", [40, 8, 0],
                                         str(tmp_path / "ref"))
    assert len(train) == 40 and len(valid) == 8
    _assert_same_stream(train, ref_train, 40)
    _assert_same_stream(valid, ref_valid, 8)


def test_test_split_is_megatron_cores(corpora, tmp_path):
    """The test split --split gives a share: megatron-core's test samples, in its order; a
    split without a test share gives none (Megatron-LM then evaluates no test set)."""
    a, _ = corpora
    _, _, test = _ours_with_test(_data([a], split="80,10,10", test=8))
    reference = _reference(([a], None), "80,10,10", [40, 8, 8], str(tmp_path / "ref"))[2]
    assert len(test) == 8
    _assert_same_stream(test, reference, 8)
    assert _ours_with_test(_data([a], split="90,10,0", test=8))[2] is None


def test_weighted_blend_stream_is_blended_datasets(corpora, tmp_path):
    a, b = corpora
    train, _ = _ours(_data(["0.7", a, "0.3", b], valid=0))
    ref_train, _, _ = _reference(([a, b], [0.7, 0.3]), "90,10,0", [40, 0, 0],
                                 str(tmp_path / "ref"))
    _assert_same_stream(train, ref_train, 40)


def _source(sample, ranges) -> int:
    """Which dataset a sample came from, by its ids alone (the corpora use disjoint ids)."""
    ids = sample["tokens"][sample["tokens"] != BYTE_EOD]
    owners = {k for k, (low, high) in enumerate(ranges)
              if bool(((ids >= low) & (ids < high)).all())}
    assert len(owners) == 1, "a sample mixes datasets"
    return owners.pop()


def test_megatron_core_reads_a_repeated_prefix_twice(tmp_path):
    """The fact behind refusing ``--data-path 0.5 a 0.5 a`` (data_arguments.parse_blend):
    megatron-core builds one dataset per entry, with the same sample order, so the blend reads
    each of the first samples twice and the rest never -- unlike ``1.0 a``."""
    prefix = str(tmp_path / "a")
    write_corpus(prefix, 150, seed=3)
    num_samples = 40
    twice = _reference(([prefix, prefix], [0.5, 0.5]), "100,0,0", [num_samples, 0, 0],
                       str(tmp_path / "cache"))[0]
    once = _reference(([prefix], None), "100,0,0", [num_samples, 0, 0],
                      str(tmp_path / "cache"))[0]
    as_bytes = lambda dataset: [dataset[i]["tokens"].numpy().tobytes()  # noqa: E731
                                for i in range(num_samples)]
    read_twice, read_once = as_bytes(twice), as_bytes(once)
    assert len(set(read_once)) == num_samples
    assert len(set(read_twice)) == num_samples // 2  # every sample read twice
    assert set(read_twice) == set(read_once[:num_samples // 2])


@pytest.mark.parametrize("weights", [(0.7, 0.3), (0.5, 0.3, 0.2)])
def test_blend_follows_its_weights(tmp_path, weights):
    ranges = [(0, 80), (80, 160), (160, 256)][:len(weights)]
    entries = []
    for k, (weight, id_range) in enumerate(zip(weights, ranges)):
        write_corpus(str(tmp_path / f"d{k}"), 150, seed=k, id_range=id_range)
        entries += [str(weight), str(tmp_path / f"d{k}")]
    num_samples = 200
    train, _ = _ours(_data(entries, train=num_samples, valid=0))
    counts = np.bincount([_source(train[i], ranges) for i in range(num_samples)],
                         minlength=len(weights))
    # megatron-core's blending keeps every prefix of the stream within one sample of its share
    assert np.all(np.abs(counts - np.asarray(weights) * num_samples) <= 1), counts


def test_per_split_paths_are_blend_per_split(corpora, tmp_path):
    a, b = corpora
    train, valid = _ours(_data(None, split=None, train=24, valid=8,
                               train_data_path=("0.5", a, "0.5", b), valid_data_path=(b,)))
    ref_train, ref_valid, _ = _reference(
        None, None, [24, 8, 0], str(tmp_path / "ref"),
        blend_per_split=[([a, b], [0.5, 0.5]), ([b], None), None])
    _assert_same_stream(train, ref_train, 24)
    _assert_same_stream(valid, ref_valid, 8)


def test_packed_samples_are_padded_to_the_cp_multiple(corpora):
    a, _ = corpora
    train, _ = _ours(_data([a], valid=0), pad_to_seq_length=False, multiple=12)
    sample = train[3]
    assert sample["length"] == SEQ_LENGTH and sample["padded_length"] == 36
    assert sample["loss_mask"][SEQ_LENGTH:].sum() == 0
    assert sample["num_loss_tokens"] == SEQ_LENGTH


def test_unweighted_blend_too_small_for_the_run_is_one_line(corpora):
    a, b = corpora
    with pytest.raises(ValueError) as err:
        _ours(_data([a, b], train=5000, valid=0))
    assert str(err.value).startswith(
        "--data-path lists its datasets without weights: megatron-core then reads one epoch of "
        "each, "), err.value
    assert "fewer than the run's 5000 training samples" in str(err.value)


def build_tiny_default_split(prefix: str) -> tuple:
    train, valid = _ours(_data([prefix], split="969, 30, 1", train=12, valid=0))
    return valid is None, len(train), train[11]["length"]


def test_unread_empty_splits_are_not_built(tmp_path):
    """10 documents under the default split leave validation and test without a document:
    megatron-core would search them forever for a first sample (so the build runs under the
    harness's deadline: a hang fails); unread, they are not built."""
    write_corpus(str(tmp_path / "tiny"), 10, seed=5)
    [result] = run_distributed(build_tiny_default_split, 1, args=(str(tmp_path / "tiny"),),
                               timeout_s=120)
    assert result == (True, 12, SEQ_LENGTH)


def test_file_reads_give_the_memory_mapped_stream(corpora):
    a, _ = corpora
    mapped, _ = _ours(_data([a], valid=0))
    read, _ = _ours(_data([a], valid=0, mmap_bin_files=False))  # --no-mmap-bin-files
    assert not read.core.dataset.mmap
    for i in range(len(mapped)):
        assert torch.equal(mapped[i]["tokens"], read[i]["tokens"])


def test_unread_per_split_datasets_are_still_checked(corpora, tmp_path):
    a, _ = corpora
    with pytest.raises(ValueError, match="--test-data-path: indexed dataset .*typo"):
        _ours(_data(None, split=None, train=8, valid=0, train_data_path=(a,),
                    test_data_path=(str(tmp_path / "typo"),)))
