"""Reading slices of, and writing, Hugging Face ``safetensors`` checkpoints.

A checkpoint directory holds either ``model.safetensors`` or shards listed by
``model.safetensors.index.json`` (``{"weight_map": {tensor name: shard file}}``); with both, the
single file is read, as ``transformers`` reads it. Reads go through
``safe_open(...).get_slice`` so a rank reads only the rows/columns it keeps, never whole tensors
it does not need.
"""

from __future__ import annotations

import json
import os
import re

import torch

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
SHARD_FORMAT = "model-{:05d}-of-{:05d}.safetensors"
_SHARD_NAME = re.compile(r"model-\d+-of-\d+\.safetensors")


class CheckpointFileError(ValueError):
    """A missing or inconsistent checkpoint file; the message is one line."""


class SafetensorsReader:
    """Reads tensor slices from a checkpoint directory (single file or index + shards).

    Args:
        hf_dir: The checkpoint directory.
    """

    def __init__(self, hf_dir: str):
        self.hf_dir = hf_dir
        self._weight_map = self._read_weight_map(hf_dir)
        self._handles: dict[str, object] = {}

    @staticmethod
    def _read_weight_map(hf_dir: str) -> dict[str, str]:
        from safetensors import safe_open

        single = os.path.join(hf_dir, SINGLE_FILE)
        if os.path.isfile(single):  # before the index, as transformers' from_pretrained does
            with safe_open(single, framework="pt") as handle:
                return {name: SINGLE_FILE for name in handle.keys()}
        index = os.path.join(hf_dir, INDEX_FILE)
        if os.path.isfile(index):
            with open(index, encoding="utf-8") as handle:
                weight_map = json.load(handle).get("weight_map") or {}
            missing = sorted({f for f in weight_map.values()
                              if not os.path.isfile(os.path.join(hf_dir, f))})
            if missing:
                raise CheckpointFileError(f"{index} names shard {missing[0]!r}, which is missing "
                                          f"from {hf_dir!r} ({len(missing)} missing)")
            return weight_map
        raise CheckpointFileError(f"Hugging Face checkpoint {hf_dir!r} has neither "
                                  f"{SINGLE_FILE} nor {INDEX_FILE}")

    def names(self) -> set[str]:
        return set(self._weight_map)

    def _handle(self, name: str):
        from safetensors import safe_open

        if name not in self._weight_map:
            raise CheckpointFileError(f"Hugging Face checkpoint {self.hf_dir!r} has no tensor "
                                      f"{name!r}")
        filename = self._weight_map[name]
        if filename not in self._handles:
            self._handles[filename] = safe_open(os.path.join(self.hf_dir, filename),
                                                framework="pt")
        return self._handles[filename]

    def shape(self, name: str) -> list[int]:
        return list(self._handle(name).get_slice(name).get_shape())

    def read(self, name: str, rows=None, cols=None) -> torch.Tensor:
        """``tensor[rows[0]:rows[1], cols[0]:cols[1]]`` (None = all), as float32."""
        sliced = self._handle(name).get_slice(name)
        row_slice = slice(*rows) if rows is not None else slice(None)
        if cols is None:
            tensor = sliced[row_slice]
        else:
            tensor = sliced[row_slice, slice(*cols)]
        return tensor.to(torch.float32)


def write_shard(path: str, tensors: dict[str, torch.Tensor]) -> None:
    """Writes one safetensors file (contiguous, un-aliased copies of the tensors)."""
    from safetensors.torch import save_file

    save_file({name: t.detach().contiguous().clone() for name, t in tensors.items()}, path,
              metadata={"format": "pt"})


def write_index(hf_dir: str, weight_map: dict[str, str], total_bytes: int) -> None:
    with open(os.path.join(hf_dir, INDEX_FILE), "w", encoding="utf-8") as handle:
        json.dump({"metadata": {"total_size": total_bytes},
                   "weight_map": dict(sorted(weight_map.items()))}, handle, indent=2)


def stale_weight_files(hf_dir: str, written: set[str]) -> list[str]:
    """The weight files (single file, shards, index) in ``hf_dir`` that an export which wrote
    ``written`` did not write: an earlier export's, in another layout. They must go:
    ``transformers`` prefers ``model.safetensors`` to an index, so an old single file beside new
    shards would be loaded instead of them."""
    def is_weight_file(name: str) -> bool:
        return name in (SINGLE_FILE, INDEX_FILE) or _SHARD_NAME.fullmatch(name) is not None

    return sorted(name for name in os.listdir(hf_dir)
                  if is_weight_file(name) and name not in written)
