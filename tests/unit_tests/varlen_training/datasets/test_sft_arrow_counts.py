"""Parquet/Arrow SFT: how many rows were truncated (rows and tokens, over every rank's reads,
counted once) and which order a folder's shards are read in (name order, as datasets and
pyarrow read it; said in the log, with a warning where numbered names sort otherwise; a renamed
shard changes the data fingerprint a resume checks).

The truncation counts are checked against the JSONL reader on the same conversations, which
encodes every sample at start-up and counts its truncated ones there."""

from __future__ import annotations

from pathlib import Path

import pytest

from megatron.varlen_training.datasets import sft, sft_arrow, truncation_report
from megatron.varlen_training.datasets.builder import EpochDataset
from megatron.varlen_training.tokenizer import ByteLevelTokenizer
from tests.harness.extras import require_extra
from tests.harness.multirank import run_distributed
from tests.unit_tests.varlen_training.datasets.sft_files import (
    conversations, write_jsonl, write_parquet,
)

require_extra("data")  # the whole module skips before its imports of datasets and pyarrow

import datasets  # noqa: E402

NUM_CHATS = 40
SEQ_LENGTH = 64
WORLD = 2


@pytest.fixture(autouse=True)
def arrow_cache(tmp_path, monkeypatch):
    """datasets' Parquet -> Arrow cache in the test's folder, not the user's."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))


def _expected_cuts(chats: list[dict], folder: Path, rows: range) -> dict[int, int]:
    """{row: tokens cut} of ``rows`` by the JSONL reader: every sample encoded whole at
    start-up (its own count, ``num_truncated``, must agree)."""
    path = write_jsonl(chats, folder / "chats.jsonl")
    whole = sft._load_documents(path, ByteLevelTokenizer(), sft.SFTKeys())
    cuts = {row: len(ids) - (SEQ_LENGTH + 1) for row, (ids, _) in enumerate(whole)
            if len(ids) > SEQ_LENGTH + 1}
    assert len(cuts) == sft.SFTDataset(path, ByteLevelTokenizer(), SEQ_LENGTH).num_truncated
    return {row: cut for row, cut in cuts.items() if row in rows}


def _arrow(chats: list[dict], folder: Path) -> sft_arrow.ArrowSFTDataset:
    return sft_arrow.ArrowSFTDataset(write_parquet(chats, folder / "chats.parquet"),
                                     ByteLevelTokenizer(), SEQ_LENGTH)


def test_rows_and_tokens_truncated_are_counted(tmp_path, capsys):
    chats = conversations(NUM_CHATS)
    dataset = _arrow(chats, tmp_path)
    rows = range(5, NUM_CHATS)
    for _ in range(2):  # a second epoch counts nothing twice
        for row in rows:
            dataset[row]
    expected = _expected_cuts(chats, tmp_path, rows)
    assert len(expected) >= 3  # the comparison covers several truncated rows
    assert dataset.truncated_rows == expected
    # the split datasets (EpochDataset over the file) lead to the same file, counted once
    splits = [EpochDataset(dataset, list(rows), 8, 0, False), None,
              EpochDataset(dataset, [0, 1], 2, 0, False)]
    assert truncation_report.report_truncated_rows(splits) == {dataset.path: expected}
    out = capsys.readouterr().out
    assert (f"ArrowSFTDataset: {len(expected)} of {NUM_CHATS} rows in {dataset.path} were "
            f"longer than --seq-length {SEQ_LENGTH} and were truncated when read "
            f"({sum(expected.values())} tokens cut)") in out
    assert out.count("was truncated (the rows and tokens cut are counted") == 1  # one warning


def test_nothing_truncated_prints_nothing(tmp_path, capsys):
    short = [{"prompt": "p", "response": "r"}] * 4
    dataset = _arrow(short, tmp_path)
    for row in range(len(short)):
        dataset[row]
    assert truncation_report.report_truncated_rows([dataset]) == {dataset.path: {}}
    assert "truncated" not in capsys.readouterr().out


def _read_and_report(path: str, rows: list[int], cache: str) -> dict:
    datasets.config.HF_DATASETS_CACHE = cache
    dataset = sft_arrow.ArrowSFTDataset(path, ByteLevelTokenizer(), SEQ_LENGTH)
    for row in rows:
        dataset[row]
    return truncation_report.report_truncated_rows([EpochDataset(dataset, rows, 4, 0, False)])


def test_ranks_reads_are_merged_and_counted_once(tmp_path):
    """Rank 0 reads rows 0-29, rank 1 rows 10-39 (rows 10-29 by both, as TP ranks would): the
    report counts every truncated row of 0-39 once, the same on both ranks."""
    chats = conversations(NUM_CHATS)
    path = write_parquet(chats, tmp_path / "chats.parquet")
    reads = [list(range(0, 30)), list(range(10, NUM_CHATS))]
    results = run_distributed(_read_and_report_on_rank, WORLD,
                              args=(path, reads, str(tmp_path / "hf_cache")), timeout_s=120)
    expected = {path: _expected_cuts(chats, tmp_path, range(NUM_CHATS))}
    assert results == [expected, expected]


def _read_and_report_on_rank(path: str, reads: list[list[int]], cache: str) -> dict:
    import torch

    return _read_and_report(path, reads[torch.distributed.get_rank()], cache)


def _shards(folder: Path, names: list[str]) -> str:
    folder.mkdir()
    for number, name in enumerate(names):
        write_parquet([{"prompt": f"shard {name}", "response": f"row {number}"}],
                      folder / name)
    return str(folder)


def test_shards_are_read_in_name_order_as_datasets_reads_them(tmp_path, capsys):
    names = ["part-1.parquet", "part-2.parquet", "part-10.parquet"]
    folder = _shards(tmp_path / "shards", names)
    rows = sft_arrow.load_arrow_table(folder, sft.SFTKeys())
    reference = datasets.load_dataset("parquet", data_dir=folder, split="train")
    assert rows["prompt"] == reference["prompt"] == [
        "shard part-1.parquet", "shard part-10.parquet", "shard part-2.parquet"]
    out = capsys.readouterr().out
    assert (f"> reading 3 Parquet shard(s) of {folder} in name order (as datasets and pyarrow "
            f"read a folder): part-1.parquet, part-10.parquet, part-2.parquet") in out
    assert (f"--data-path {folder}: shard part-10.parquet is read before part-2.parquet (name "
            f"order: their numbers are not zero-padded)") in out


def test_zero_padded_shards_warn_nothing_and_a_rename_changes_the_fingerprint(tmp_path,
                                                                             capsys):
    from megatron.varlen_training.data_fingerprints import data_fingerprint

    folder = _shards(tmp_path / "shards", ["part-1.parquet", "part-2.parquet",
                                           "part-10.parquet"])
    before = data_fingerprint(folder)
    for number in (1, 2, 10):
        Path(folder, f"part-{number}.parquet").rename(Path(folder, f"part-{number:05d}.parquet"))
    sft_arrow.load_arrow_table(folder, sft.SFTKeys())
    assert "not zero-padded" not in capsys.readouterr().out
    # the rows' order changed: a run saved before the rename must not resume on it silently
    assert data_fingerprint(folder) != before
