"""Tests for megatron/varlen_training/datasets/builder.py."""

import argparse
import json
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from megatron.varlen_training.datasets import (
    MockGPTDataset,
    MockSFTDataset,
    SFTDataset,
    build_datasets,
    get_pad_multiple,
)
from megatron.varlen_training.datasets.builder import VALID_FRACTION, build_split_datasets
from megatron.varlen_training.tokenizer import ByteLevelTokenizer, NullTokenizer


def roundup(value, multiple):
    return -(-value // multiple) * multiple


def _args(**overrides):
    values = dict(
        mock_data=True,
        sft=False,
        data_path=None,
        seq_length=32,
        seed=1234,
        train_samples=24,
        eval_samples=6,
        test_samples=0,
        sft_mock_dataset_config_json=None,
        context_parallel_size=1,
        tensor_model_parallel_size=1,
        sequence_parallel=False,
        sequence_packing=True,
        vocab_size=64,
        split=None,
    )
    values.update(overrides)
    return argparse.Namespace(**values)


def _build(args, tokenizer, **kwargs):
    """build_datasets on the run config these flat values describe."""
    return build_datasets(_run(args), tokenizer, **kwargs)


def _run(args):
    """A stand-in for the run config with the fields build_datasets reads."""
    return SimpleNamespace(
        model=SimpleNamespace(seq_length=args.seq_length, vocab_size=args.vocab_size),
        data=SimpleNamespace(
            mock_data=args.mock_data, sft=args.sft, data_path=args.data_path,
            sft_mock_dataset_config_json=args.sft_mock_dataset_config_json,
            train_samples=args.train_samples, eval_samples=args.eval_samples,
            test_samples=args.test_samples, split=args.split,
            sft_messages_key="messages", sft_prompt_key="prompt", sft_response_key="response",
            indexed=bool(args.data_path) and not args.mock_data and not args.sft,
            full_validation=getattr(args, "full_validation", False)),
        training=SimpleNamespace(seed=args.seed),
        parallel=SimpleNamespace(context_parallel_size=args.context_parallel_size,
                                 tensor_model_parallel_size=args.tensor_model_parallel_size,
                                 sequence_parallel=args.sequence_parallel),
        packing=SimpleNamespace(sequence_packing=args.sequence_packing))



@pytest.mark.parametrize("sft", [False, True])
def test_mock_test_split(sft):
    """Mock data has a test split (as Megatron-LM's): its own seed, --eval-iters x global batch
    samples, none when no test samples are asked for."""
    lengths = json.dumps({"mode": "distribution", "type": "lognormal", "min_seq_len": 4,
                          "max_seq_len": 32, "mean_seq_len": 12, "lognormal_sigma": 1.0})
    args = _args(test_samples=4, sft=sft, sft_mock_dataset_config_json=lengths if sft else None)
    train, valid, test = build_split_datasets(_run(args), NullTokenizer(64))
    assert type(test) is type(valid) and len(test) == 4
    for other in (train, valid):
        assert not torch.equal(test[0]["tokens"], other[0]["tokens"])
    args = _args(sft=sft, sft_mock_dataset_config_json=args.sft_mock_dataset_config_json)
    assert build_split_datasets(_run(args), NullTokenizer(64))[2] is None


def _sft_file(tmp_path, num_docs):
    path = tmp_path / "sft.jsonl"
    lines = [json.dumps({"prompt": f"p{i}", "response": "r" * (i % 5)}) for i in range(num_docs)]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_mock_gpt_train_and_valid():
    train, valid = _build(_args(), NullTokenizer(64))
    assert isinstance(train, MockGPTDataset) and isinstance(valid, MockGPTDataset)
    assert (len(train), len(valid)) == (24, 6)
    assert train[0]["padded_length"] == 32 and train[0]["tokens"].max() < 64
    assert not torch.equal(train[0]["tokens"], valid[0]["tokens"])
    _, no_valid = _build(_args(eval_samples=0), NullTokenizer(64))
    assert no_valid is None


def test_mock_without_tokenizer_uses_vocab_size():
    train, _ = _build(_args(vocab_size=8), None)
    assert max(train[i]["tokens"].max().item() for i in range(len(train))) < 8


@pytest.mark.parametrize("packing", [True, False])
def test_mock_sft_padding(packing):
    args = _args(
        sft=True,
        vocab_size=None,
        sequence_packing=packing,
        context_parallel_size=2,
        tensor_model_parallel_size=2,
        sequence_parallel=True,
        sft_mock_dataset_config_json=json.dumps(
            {"mode": "distribution", "type": "lognormal", "min_seq_len": 3, "max_seq_len": 32,
             "mean_seq_len": 12, "lognormal_sigma": 1.0}
        ),
    )
    train, valid = _build(args, ByteLevelTokenizer())
    assert isinstance(train, MockSFTDataset) and isinstance(valid, MockSFTDataset)
    multiple = get_pad_multiple(2, 2, True)
    for i in range(len(train)):
        s = train[i]
        assert s["padded_length"] == (roundup(s["length"], multiple) if packing else 32)
        assert s["tokens"].max() < ByteLevelTokenizer().vocab_size
    assert len(set(train.lengths.tolist())) > 1


def test_mock_sft_default_lengths_and_clipping(capsys):
    train, _ = _build(_args(sft=True), NullTokenizer(64))  # default: [16, 32]
    assert 16 <= train.lengths.min() and train.lengths.max() <= 32 and train.num_clipped == 0
    too_long = {"mode": "distribution", "type": "uniform", "min_seq_len": 20, "max_seq_len": 64}
    capsys.readouterr()
    train, _ = _build(
        _args(sft=True, sft_mock_dataset_config_json=json.dumps(too_long)), NullTokenizer(64)
    )
    assert train.num_clipped > 0 and train.lengths.max() == 32
    lines = capsys.readouterr().out.splitlines()  # megatron log lines on stdout
    assert sum("WARNING" in line and "clipped" in line for line in lines) == 2  # train, valid


def test_explicit_pad_multiple_overrides_parallel_sizes():
    train, _ = _build(_args(seq_length=30), NullTokenizer(64), pad_to_multiple_of=8)
    assert train[0]["padded_length"] == 32 and train[0]["length"] == 30


def test_unpacked_seq_length_must_fit_the_multiple():
    args = _args(sequence_packing=False, context_parallel_size=2, seq_length=30)
    with pytest.raises(ValueError, match="--seq-length 30 must be a multiple of 4"):
        _build(args, NullTokenizer(64))


def test_flag_errors(tmp_path):
    with pytest.raises(ValueError, match="--data-path"):
        _build(_args(mock_data=False, sft=True, vocab_size=None), ByteLevelTokenizer())
    with pytest.raises(ValueError, match="no training data: pass --mock-data, --data-path"):
        _build(_args(mock_data=False, data_path=None), NullTokenizer(64))
    with pytest.raises(ValueError, match=r"--vocab-size 64 is smaller than .* \(261\)"):
        _build(_args(), ByteLevelTokenizer())


def test_sft_split_epochs_and_sample_ids(tmp_path):
    num_docs = 40
    args = _args(mock_data=False, sft=True, data_path=[_sft_file(tmp_path, num_docs)],
                 vocab_size=None, train_samples=100, eval_samples=5)
    tok = ByteLevelTokenizer()
    train, valid = _build(args, tok)
    full = SFTDataset(args.data_path[0], tok, args.seq_length)
    num_valid = round(VALID_FRACTION * num_docs)
    doc_of = {tuple(full[i]["tokens"].tolist()): i for i in range(num_docs)}
    train_docs = [doc_of[tuple(train[i]["tokens"].tolist())] for i in range(len(train))]
    valid_docs = [doc_of[tuple(valid[i]["tokens"].tolist())] for i in range(len(valid))]
    num_train = num_docs - num_valid
    assert len(train_docs) == 100 and valid_docs == [38, 39, 38, 39, 38]
    for epoch_start in (0, num_train):  # every full epoch is a permutation of the train docs
        assert sorted(train_docs[epoch_start : epoch_start + num_train]) == list(range(num_train))
    assert train_docs[:num_train] != train_docs[num_train : 2 * num_train]
    assert train_docs[:num_train] != list(range(num_train))  # shuffled
    assert [train[i]["sample_id"] for i in (0, 57, 99)] == [0, 57, 99]
    again, _ = _build(args, tok)
    reread = [doc_of[tuple(again[i]["tokens"].tolist())] for i in reversed(range(100))]
    assert reread[::-1] == train_docs
    with pytest.raises(IndexError):
        train[100]


def test_sft_too_small_for_a_valid_tail(tmp_path):
    args = _args(mock_data=False, sft=True, data_path=[_sft_file(tmp_path, 1)], vocab_size=None)
    with pytest.raises(ValueError, match="1 sample.*--eval-iters 0"):
        _build(args, ByteLevelTokenizer())
    train, valid = _build(_args(**{**vars(args), "eval_samples": 0}), ByteLevelTokenizer())
    assert valid is None and len(train) == args.train_samples
    assert np.all([train[i]["sample_id"] == i for i in range(len(train))])


def _docs_read(dataset, full) -> list[int]:
    doc_of = {tuple(full[i]["tokens"].tolist()): i for i in range(len(full))}
    return [doc_of[tuple(dataset[i]["tokens"].tolist())] for i in range(len(dataset))]


@pytest.mark.parametrize("split, train_docs, valid_docs, test_docs", [
    # float64 by hand: N = 40 documents, split k = [round(start_k * N), round(end_k * N))
    ("80,15,5", range(0, 32), range(32, 38), range(38, 40)),
    ("98,2,0", range(0, 39), range(39, 40), None),  # round(0.98 * 40) = 39; no test share
    ("1,1,0", range(0, 20), range(20, 40), None),
])
def test_sft_split_flag_gives_megatron_core_document_ranges(tmp_path, split, train_docs,
                                                            valid_docs, test_docs):
    """--split splits an SFT file as megatron-core splits an indexed dataset's documents (it
    used to be ignored for the fixed 5% tail): an epoch of training reads every training
    document once, validation and test their documents in order; a test share is the test
    split the end of training evaluates, and nothing reads it without test samples."""
    num_docs = 40
    args = _args(mock_data=False, sft=True, data_path=[_sft_file(tmp_path, num_docs)],
                 vocab_size=None, train_samples=len(train_docs), eval_samples=len(valid_docs),
                 test_samples=3, split=split)
    tok = ByteLevelTokenizer()
    train, valid, test = build_split_datasets(_run(args), tok)
    full = SFTDataset(args.data_path[0], tok, args.seq_length)
    assert sorted(_docs_read(train, full)) == list(train_docs)
    assert _docs_read(valid, full) == list(valid_docs)
    if test_docs is None:
        assert test is None
    else:  # 3 samples cycle over the test documents in file order
        assert _docs_read(test, full) == [*test_docs, test_docs[0]]
    unread = build_split_datasets(_run(_args(**{**vars(args), "test_samples": 0})), tok)
    assert unread[2] is None


@pytest.mark.parametrize("split, eval_samples, needle", [
    ("0,1,0", 5, "--split '0,1,0' leaves the training split of"),
    ("99,1,0", 5, "--split '99,1,0' leaves the validation split of"),  # round(0.99 * 40) = 40
    # round(0.97 * 40) = 39, round(0.99 * 40) = 40: the test share holds no sample
    ("97,2,1", 5, "--split '97,2,1' leaves the test split of"),
])
def test_sft_split_that_leaves_a_read_split_empty_is_one_line(tmp_path, split, eval_samples,
                                                              needle):
    args = _args(mock_data=False, sft=True, data_path=[_sft_file(tmp_path, 40)],
                 vocab_size=None, eval_samples=eval_samples, test_samples=5, split=split)
    with pytest.raises(ValueError) as err:
        _build(args, ByteLevelTokenizer())
    assert needle in str(err.value) and "\n" not in str(err.value)
    # The --split the message suggests gives every split that is read its samples.
    suggested = re.search(r"e\.g\. --split ([0-9,]+)\)", str(err.value)).group(1)
    splits = build_split_datasets(_run(_args(**{**vars(args), "split": suggested})),
                                  ByteLevelTokenizer())
    assert len(splits[0]) > 0 and len(splits[1]) > 0  # a test split only where it has a share
    train, valid = _build(_args(**{**vars(args), "eval_samples": 0, "split": "99,1,0"}),
                          ByteLevelTokenizer())
    assert valid is None and len(train) == args.train_samples


def test_full_validation_builds_every_sft_validation_document_once(tmp_path):
    """--full-validation: the validation split of an SFT file is its validation documents,
    each once, in order, whatever --eval-iters asks for (megatron-core's ranges: 80,15,5 of 40
    documents keeps documents 32-37 for validation)."""
    args = _args(mock_data=False, sft=True, data_path=[_sft_file(tmp_path, 40)], vocab_size=None,
                 train_samples=32, eval_samples=2, test_samples=0, split="80,15,5",
                 full_validation=True)
    tok = ByteLevelTokenizer()
    _, valid, _ = build_split_datasets(_run(args), tok)
    assert _docs_read(valid, SFTDataset(args.data_path[0], tok, args.seq_length)) \
        == list(range(32, 38))
