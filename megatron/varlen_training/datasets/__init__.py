"""Datasets of the training layer: mock pretraining, mock SFT, SFT data from JSONL or
Parquet/Arrow, Megatron indexed data (through megatron-core), and the preprocessing behind
tools/preprocess_data.py.

Every dataset returns samples in the format documented in :mod:`.sample`;
:func:`build_datasets` picks the datasets from the command line. The mock SFT dataset's length
distributions live below the scheduler, in :mod:`megatron.varlen.packing.length_distributions`.
Names are imported on first use (:mod:`megatron.varlen.lazy_exports`): tools/preprocess_data.py
imports the preprocessing without the training layer's heavier imports (and their import-time
warnings).
"""

from megatron.varlen.lazy_exports import lazy_exports

_BUILDER = "megatron.varlen_training.datasets.builder"
_MOCK = "megatron.varlen_training.datasets.mock"
_SAMPLE = "megatron.varlen_training.datasets.sample"
_EXPORTS = {
    "EpochDataset": _BUILDER, "build_datasets": _BUILDER,
    "MockGPTDataset": _MOCK, "MockSFTDataset": _MOCK,
    "collate_padded": _SAMPLE, "get_pad_multiple": _SAMPLE, "make_sample": _SAMPLE,
    "SFTDataset": "megatron.varlen_training.datasets.sft",
    "ArrowSFTDataset": "megatron.varlen_training.datasets.sft_arrow",
    "IndexedGPTSamples": "megatron.varlen_training.datasets.indexed",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
