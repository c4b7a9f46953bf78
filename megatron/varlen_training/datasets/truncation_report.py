"""How many Parquet/Arrow SFT rows were truncated, over every rank's reads, in one line.

:class:`~megatron.varlen_training.datasets.sft_arrow.ArrowSFTDataset` tokenizes a row when a
rank reads it, so no rank knows up front which rows are longer than ``--seq-length``; each
counts the rows it truncated (``truncated_rows``: row -> tokens cut). At the end of training
:func:`report_truncated_rows` gathers those counts over the world once and rank 0 prints one
line per file, in the form of the JSONL reader's start-up count (``SFTDataset: N of M samples
in PATH are longer than --seq-length S and were truncated``). Rows are counted once however
many ranks read them (the TP and CP ranks of a replica read the same rows) and however often
(epochs, evaluations).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from megatron.varlen_training.datasets.sft_arrow import ArrowSFTDataset
from megatron.varlen_training.log import is_multi_rank, warning_rank_0

TruncatedRows = dict[str, dict[int, int]]  # path -> {row: tokens cut}


def arrow_sources(datasets: Iterable) -> list[ArrowSFTDataset]:
    """The distinct ArrowSFTDatasets the split datasets read from (None entries skipped)."""
    found: dict[int, ArrowSFTDataset] = {}
    for dataset in datasets:
        while dataset is not None and not isinstance(dataset, ArrowSFTDataset):
            dataset = getattr(dataset, "source", None)
        if dataset is not None:
            found[id(dataset)] = dataset
    return list(found.values())


def gather_truncated_rows(local: TruncatedRows) -> TruncatedRows:
    """Every rank's counts merged (a collective over the world when it has several ranks)."""
    if not is_multi_rank():
        return local
    gathered: list[TruncatedRows | None] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, local)
    merged: TruncatedRows = {}
    for counts in gathered:
        for path, rows in counts.items():
            merged.setdefault(path, {}).update(rows)
    return merged


def report_truncated_rows(datasets: Iterable) -> TruncatedRows:
    """Prints (rank 0) how many rows of each Parquet/Arrow file were truncated when read, over
    every rank; returns the merged counts. Every rank must call it when the data is
    Parquet/Arrow SFT (the same flags on every rank: all call it or none gathers)."""
    sources = arrow_sources(datasets)
    if not sources:
        return {}
    local: TruncatedRows = {}
    for source in sources:
        local.setdefault(source.path, {}).update(source.truncated_rows)
    merged = gather_truncated_rows(local)
    for source in sources:
        rows = merged.get(source.path, {})
        if rows:
            warning_rank_0("ArrowSFTDataset: %d of %d rows in %s were longer than --seq-length "
                           "%d and were truncated when read (%d tokens cut)", len(rows),
                           len(source), source.path, source.seq_length, sum(rows.values()))
    return merged
