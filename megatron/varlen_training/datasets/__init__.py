"""Datasets of the training layer: mock pretraining, mock SFT, JSONL SFT data and Megatron
indexed data (through megatron-core), and the preprocessing behind tools/preprocess_data.py.

Every dataset returns samples in the format documented in :mod:`.sample`;
:func:`build_datasets` picks the datasets from the command line. The mock SFT dataset's length
distributions live below the scheduler, in :mod:`megatron.varlen.packing.length_distributions`.
Names are imported on first use (PEP 562): tools/preprocess_data.py imports the preprocessing
without the training layer's heavier imports (and their import-time warnings).
"""

import importlib

_BUILDER = "megatron.varlen_training.datasets.builder"
_MOCK = "megatron.varlen_training.datasets.mock"
_SAMPLE = "megatron.varlen_training.datasets.sample"
_EXPORTS = {
    "EpochDataset": _BUILDER, "build_datasets": _BUILDER,
    "MockGPTDataset": _MOCK, "MockSFTDataset": _MOCK,
    "collate_padded": _SAMPLE, "get_pad_multiple": _SAMPLE, "make_sample": _SAMPLE,
    "SFTDataset": "megatron.varlen_training.datasets.sft",
    "IndexedGPTSamples": "megatron.varlen_training.datasets.indexed",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
