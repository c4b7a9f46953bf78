"""Datasets of the training layer: mock pretraining, mock SFT, and SFT data from JSONL or
Parquet/Arrow.

Every dataset returns samples in the format documented in :mod:`.sample`;
:func:`build_datasets` picks the datasets from the command line. The mock SFT dataset's length
distributions live below the scheduler, in :mod:`megatron.varlen.packing.length_distributions`.
"""

from megatron.varlen_training.datasets.builder import EpochDataset, build_datasets
from megatron.varlen_training.datasets.mock import MockGPTDataset, MockSFTDataset
from megatron.varlen_training.datasets.sample import collate_padded, get_pad_multiple, make_sample
from megatron.varlen_training.datasets.sft import SFTDataset
from megatron.varlen_training.datasets.sft_arrow import ArrowSFTDataset

__all__ = [
    "ArrowSFTDataset",
    "EpochDataset",
    "MockGPTDataset",
    "MockSFTDataset",
    "SFTDataset",
    "build_datasets",
    "collate_padded",
    "get_pad_multiple",
    "make_sample",
]
