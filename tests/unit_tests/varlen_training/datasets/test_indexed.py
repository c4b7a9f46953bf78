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
from tests.unit_tests.varlen_training.datasets.indexed_corpus import write_corpus

SEQ_LENGTH = 32
SEED = 1234


class _Tokenizer:  # what megatron-core's datasets read of a tokenizer, written independently
    vocab_size, eod, pad = 261, BYTE_EOD, BYTE_EOD + 1
    unique_identifiers = {"class": "reference"}


def _data(data_path=None, split="90,10,0", train=40, valid=8, **paths) -> DataConfig:
    return DataConfig(mock_data=False, sft=False, sft_mock_dataset_config_json=None,
                      tokenizer_type="ByteLevelTokenizer", tokenizer_model=None,
                      train_samples=train, eval_samples=valid, split=split,
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


def test_weighted_blend_stream_is_blended_datasets(corpora, tmp_path):
    a, b = corpora
    train, _ = _ours(_data(["0.7", a, "0.3", b], valid=0))
    ref_train, _, _ = _reference(([a, b], [0.7, 0.3]), "90,10,0", [40, 0, 0],
                                 str(tmp_path / "ref"))
    _assert_same_stream(train, ref_train, 40)
