"""Datasets of the training layer: mock pretraining, mock SFT and JSONL SFT data.

Every dataset returns samples in the format documented in :mod:`.sample`;
:func:`build_datasets` picks the datasets from the command line.

The names below are imported on first use (PEP 562) so that importing the torch-free
``length_config`` submodule (used by the scheduling tools) does not import torch.
"""

import importlib

_EXPORTS = {
    "EpochDataset": "builder",
    "build_datasets": "builder",
    "MockGPTDataset": "mock",
    "MockSFTDataset": "mock",
    "collate_padded": "sample",
    "get_pad_multiple": "sample",
    "make_sample": "sample",
    "SFTDataset": "sft",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)


def __dir__():
    return sorted(list(globals()) + __all__)
