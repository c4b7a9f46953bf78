"""Indexed data made with another tokenizer is refused at start-up in one line, on every rank
(megatron/varlen_training/datasets/token_checks.py):

- the same texts preprocessed with megatron-core's ``ByteLevelTokenizer`` (its own class, the
  independent reference: eod 0) are refused under this fork's ``ByteLevelTokenizer`` (eod 256),
  while this fork's own preprocessing, and data without ``--append-eod``, pass;
- a token id at or above the vocabulary is refused naming the id, its document, the vocabulary
  size and the flags, also when it lies in the share of the documents another rank scans.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from megatron.core.datasets.indexed_dataset import IndexedDataset
from megatron.core.tokenizers.text.libraries import ByteLevelTokenizer as CoreByteLevelTokenizer

from megatron.varlen_training.config import DataConfig
from megatron.varlen_training.datasets import token_checks
from megatron.varlen_training.datasets.indexed import (
    check_indexed_data, gpt_dataset_config, split_sizes,
)
from megatron.varlen_training.errors import agree_on_errors
from megatron.varlen_training.tokenizer import ByteLevelTokenizer
from tests.harness.multirank import run_distributed
from tests.unit_tests.varlen_training.datasets.indexed_corpus import write_documents

TEXTS = [f"document {i}: " + "lorem ipsum dolor sit amet " * (1 + i % 5) for i in range(40)]
BAD_ID, BAD_DOCUMENT = 300, 37  # the byte-level vocabulary has 261 ids
BYTE_LEVEL = "ByteLevelTokenizer"


def _data(tmp_path, prefix: str) -> DataConfig:
    return DataConfig(mock_data=False, sft=False, sft_mock_dataset_config_json=None,
                      tokenizer_type="ByteLevelTokenizer", tokenizer_model=None,
                      train_samples=8, eval_samples=0, split="100,0,0", data_path=(prefix,),
                      sft_messages_key="messages", sft_prompt_key="prompt",
                      sft_response_key="response", data_cache_path=str(tmp_path / "cache"))


def _check(tmp_path, prefix: str) -> None:
    data = _data(tmp_path, prefix)
    check_indexed_data(gpt_dataset_config(data, 32, 1, ByteLevelTokenizer()), data,
                       split_sizes(data))


def _refusal(tmp_path, prefix: str) -> str:
    with pytest.raises(ValueError) as err:
        _check(tmp_path, prefix)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_the_two_byte_level_layouts_differ():
    """The facts the check rests on, from megatron-core's class and ours."""
    core, ours = CoreByteLevelTokenizer(), ByteLevelTokenizer()
    assert core.text_to_ids("hé") == ours.tokenize("hé") == list("hé".encode())
    assert (core.eod, ours.eod) == (0, 256)
    assert token_checks.FOREIGN_EODS["ByteLevelTokenizer"][0] == core.eod


def test_data_preprocessed_with_megatron_cores_byte_tokenizer_is_refused(tmp_path):
    core = CoreByteLevelTokenizer()
    prefix = write_documents(str(tmp_path / "core"),
                             [core.text_to_ids(text) + [core.eod] for text in TEXTS])
    assert _refusal(tmp_path, prefix) == (
        f"--data-path: the first 16 documents of {prefix} all end with id 0, the eod of "
        f"megatron-core's ByteLevelTokenizer (bytes 0-255, eod 0, pad 1); this run's "
        f"--tokenizer-type ByteLevelTokenizer ends documents with 256 (bytes 0-255, then eod, "
        f"pad and the chat roles), so its documents would run together unmarked: preprocess "
        f"the text again with tools/preprocess_data.py --tokenizer-type ByteLevelTokenizer "
        f"--append-eod")


@pytest.mark.parametrize("append_eod", [True, False])
def test_data_preprocessed_with_ours_passes(tmp_path, append_eod):
    ours = ByteLevelTokenizer()
    prefix = write_documents(str(tmp_path / "ours"),
                             [ours.tokenize(text) + [ours.eod] * append_eod for text in TEXTS])
    _check(tmp_path, prefix)


def _with_bad_id(tmp_path) -> str:
    ours = ByteLevelTokenizer()
    documents = [ours.tokenize(text) + [ours.eod] for text in TEXTS]
    documents[BAD_DOCUMENT][5] = BAD_ID
    return write_documents(str(tmp_path / "bad"), documents)


def test_id_outside_the_vocabulary_is_refused(tmp_path):
    prefix = _with_bad_id(tmp_path)
    assert _refusal(tmp_path, prefix) == (
        f"--data-path: {prefix}.bin holds token id {BAD_ID} (document {BAD_DOCUMENT}, position "
        f"5) but the tokenizer has 261 ids (--tokenizer-type ByteLevelTokenizer): "
        f"the data was made with another tokenizer; preprocess it again with this one "
        f"(tools/preprocess_data.py)")


@pytest.mark.parametrize("tokenizer_type, flags", [
    ("NullTokenizer", "--tokenizer-type NullTokenizer, --vocab-size"),
    ("ByteLevelTokenizer", "--tokenizer-type ByteLevelTokenizer"),
    ("HuggingFaceTokenizer", "--tokenizer-type HuggingFaceTokenizer, --tokenizer-model"),
    ("GPT2BPETokenizer", "--tokenizer-type GPT2BPETokenizer, --vocab-file, --merge-file"),
])
def test_the_refusal_names_the_flags_of_the_runs_tokenizer_type(tmp_path, tokenizer_type,
                                                                 flags):
    """The flags to change are those that chose the run's ids: GPT2BPETokenizer's files, not
    --tokenizer-model, which it does not read."""
    prefix = _with_bad_id(tmp_path)
    dataset = IndexedDataset(prefix, multimodal=False)
    with pytest.raises(ValueError) as err:
        token_checks.check_token_ids(prefix, dataset, (0, len(TEXTS)), 261, "--data-path",
                                     tokenizer_type=tokenizer_type)
    assert f"but the tokenizer has 261 ids ({flags}): the data" in str(err.value)


def test_the_scan_is_shared_and_chunked(tmp_path, monkeypatch):
    """Each rank scans its share; the bad id is in the second rank's half, found in a later
    chunk."""
    prefix = _with_bad_id(tmp_path)
    monkeypatch.setattr(token_checks, "SCAN_CHUNK_TOKENS", 64)
    dataset = IndexedDataset(prefix, multimodal=False)
    vocab = ByteLevelTokenizer().vocab_size
    token_checks.check_token_ids(prefix, dataset, (0, len(TEXTS)), vocab, "--data-path", 0, 2,
                                 tokenizer_type=BYTE_LEVEL)
    with pytest.raises(ValueError, match=f"token id {BAD_ID} .document {BAD_DOCUMENT},"):
        token_checks.check_token_ids(prefix, dataset, (0, len(TEXTS)), vocab, "--data-path",
                                     1, 2, tokenizer_type=BYTE_LEVEL)


def test_the_scan_stops_at_its_budget(tmp_path, monkeypatch):
    """A rank reads at most SCAN_BUDGET_TOKENS ids (start-up cost on a large corpus): a bad id
    past the budget is not looked at; within it, it is found."""
    prefix = _with_bad_id(tmp_path)
    dataset = IndexedDataset(prefix, multimodal=False)
    bad_offset = int(dataset.index.sequence_pointers[BAD_DOCUMENT]) // 2 + 5  # uint16 ids
    vocab = ByteLevelTokenizer().vocab_size
    monkeypatch.setattr(token_checks, "SCAN_CHUNK_TOKENS", 64)
    monkeypatch.setattr(token_checks, "SCAN_BUDGET_TOKENS", bad_offset)
    token_checks.check_token_ids(prefix, dataset, (0, len(TEXTS)), vocab, "--data-path",
                                 tokenizer_type=BYTE_LEVEL)
    monkeypatch.setattr(token_checks, "SCAN_BUDGET_TOKENS", bad_offset + 1)
    with pytest.raises(ValueError, match=f"token id {BAD_ID} .document {BAD_DOCUMENT},"):
        token_checks.check_token_ids(prefix, dataset, (0, len(TEXTS)), vocab, "--data-path",
                                 tokenizer_type=BYTE_LEVEL)


def rank_check(tmp_path: str, prefix: str) -> str | None:
    from pathlib import Path

    data = _data(Path(tmp_path), prefix)
    config = gpt_dataset_config(data, 32, 1, ByteLevelTokenizer())
    try:
        agree_on_errors(check_indexed_data, config, data, split_sizes(data))
    except ValueError as err:
        return str(err)
    return None


def test_every_rank_refuses_what_one_rank_found(tmp_path):
    prefix = _with_bad_id(tmp_path)
    messages = run_distributed(rank_check, 2, args=(str(tmp_path), prefix), timeout_s=120)
    assert messages[0] == messages[1] and messages[0] is not None
    assert f"holds token id {BAD_ID} (document {BAD_DOCUMENT}," in messages[0]
    assert np.iinfo(np.uint16).max > BAD_ID  # the dtype check alone would not have caught it


def _check_with(tmp_path, prefix: str, **data) -> None:
    config = dataclasses.replace(_data(tmp_path, prefix), **data)
    check_indexed_data(gpt_dataset_config(config, 32, 1, ByteLevelTokenizer()), config,
                       split_sizes(config))


def _documents_without_eod(tmp_path) -> str:
    ours = ByteLevelTokenizer()
    return write_documents(str(tmp_path / "no_eod"), [ours.tokenize(text) for text in TEXTS])


@pytest.mark.parametrize("flags, names", [
    (dict(reset_attention_mask=True, reset_position_ids=True),
     "--reset-position-ids, --reset-attention-mask"),
    (dict(eod_mask_loss=True), "--eod-mask-loss"),
])
def test_reset_flags_on_documents_without_eod_are_refused(tmp_path, flags, names):
    """The reset flags find documents by their eod: on text preprocessed without --append-eod
    they would change nothing (used to pass without a word)."""
    prefix = _documents_without_eod(tmp_path)
    with pytest.raises(ValueError) as err:
        _check_with(tmp_path, prefix, **flags)
    assert str(err.value) == (
        f"--data-path: none of the first 16 documents of {prefix} ends with the eod id 256 "
        f"(preprocessed without --append-eod?), so {names} would find no document boundary in "
        f"its samples and change nothing: preprocess the text again with "
        f"tools/preprocess_data.py --append-eod")


def test_documents_without_eod_warn_without_reset_flags(tmp_path, capsys):
    prefix = _documents_without_eod(tmp_path)
    _check_with(tmp_path, prefix)
    assert "its samples run documents together with nothing between them" in \
        capsys.readouterr().out
    _check_with(tmp_path, prefix, packing_unit="document")  # whole documents need no eod
    assert "nothing between them" not in capsys.readouterr().out


def test_reset_flags_on_documents_with_eod_pass(tmp_path, capsys):
    ours = ByteLevelTokenizer()
    prefix = write_documents(str(tmp_path / "eod"), [ours.tokenize(t) + [ours.eod] for t in TEXTS])
    _check_with(tmp_path, prefix, reset_attention_mask=True, reset_position_ids=True,
                eod_mask_loss=True)
    assert "nothing between them" not in capsys.readouterr().out
