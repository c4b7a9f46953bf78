"""Loading a checkpoint must not run code from it.

torch's distributed-checkpoint reader unpickles ``iter_*/.metadata`` with plain ``pickle``,
which calls whatever a crafted file names (``os.system`` via ``__reduce__``). Before megatron-core
reads a checkpoint, :func:`check_metadata_is_safe` unpickles ``.metadata`` with an allow-list of
the classes torch's checkpoint metadata is made of (listed from checkpoints this code saved:
torch.distributed.checkpoint's metadata/planner dataclasses and enums, ``torch.Size``, dtypes
and the layout decoder). Anything else is refused without being called, so once this check has
passed, torch's own unpickling of the same bytes can only build those harmless objects.

The other pickles of a checkpoint are tensors and plain containers: :func:`check_common_is_safe`
reads megatron-core's ``common.pt`` with ``torch.load(weights_only=True)`` first (megatron-core
then loads it with torch's default, which is ``weights_only=True`` only since torch 2.6), and our
per-rank RNG files are read with ``weights_only=True``. Objects megatron-core stores inside the
``.distcp`` files (e.g. ``_extra_state`` bytes) are unpickled by megatron-core with torch's
default: use torch >= 2.6 (this repo pins 2.13) for those to be restricted as well.

The small files megatron-core reads besides are checked for form first, so a garbled one is a
one-line error naming it rather than a traceback from deep inside megatron-core:
``metadata.json`` (:func:`check_config`) must be a JSON object naming the ``torch_dist`` backend,
and ``.metadata`` must name its shards (:func:`shard_files`).

Trust model (README "Reliability"): a checkpoint is data, not code; files
are checked against the manifest for corruption, not for forgery (someone who can write the
checkpoint can write its manifest), and nothing in a checkpoint is executed.
"""

from __future__ import annotations

import enum
import json
import os
import pickle

import torch

from megatron.varlen_training.errors import CheckpointError, one_line

METADATA_FILENAME = ".metadata"
COMMON_FILENAME = "common.pt"
CONFIG_FILENAME = "metadata.json"  # megatron-core's CheckpointingConfig
# What megatron-core's CheckpointingConfig accepts, and the only backend this code saves.
CONFIG_KEYS = frozenset({"sharded_backend", "sharded_backend_version", "common_backend",
                         "common_backend_version"})
SHARDED_BACKEND = "torch_dist"
_DCP = "torch.distributed.checkpoint"
ALLOWED_GLOBALS = frozenset({
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # maps a layout name to torch.strided & co.
    (f"{_DCP}.filesystem", "_StorageInfo"),
    *((f"{_DCP}.metadata", name) for name in (
        "Metadata", "MetadataIndex", "StorageMeta", "ChunkStorageMetadata",
        "TensorStorageMetadata", "BytesStorageMetadata", "TensorProperties",
        "_MEM_FORMAT_ENCODING")),
    *((f"{_DCP}.planner", name) for name in (
        "SavePlan", "WriteItem", "WriteItemType", "TensorWriteData", "LoadPlan", "ReadItem",
        "LoadItemType")),
    ("collections", "OrderedDict"),
})


ENUM_MEMBER_GLOBAL = ("builtins", "getattr")
"""How newer Pythons (3.11.2 and 3.12+, e.g. the GPU image's) pickle an enum member:
``getattr(EnumClass, "NAME")``. torch's metadata holds enum members (``_MEM_FORMAT_ENCODING``,
``WriteItemType``), so the name must resolve -- but never to the real ``getattr``, which would
reach any attribute of an allowed class (and from there anything): see :func:`_enum_member`."""


def _enum_member(cls, name: str):
    """``getattr`` restricted to what an enum-member pickle needs: a member of an Enum class
    (the class itself was already resolved through the allow-list)."""
    if not (isinstance(cls, type) and issubclass(cls, enum.Enum) and name in cls.__members__):
        raise CheckpointError(f"refusing checkpoint metadata: it asks for attribute {name!r} of "
                              f"{cls!r}, which is not an enum member (a crafted or foreign file)")
    return cls[name]


def _is_dtype(module: str, name: str) -> bool:
    return module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that resolves only :data:`ALLOWED_GLOBALS` and torch dtypes."""

    def __init__(self, file, source: str):
        super().__init__(file)
        self._source = source

    def find_class(self, module: str, name: str):
        if (module, name) in ALLOWED_GLOBALS or _is_dtype(module, name):
            return super().find_class(module, name)
        if (module, name) == ENUM_MEMBER_GLOBAL:
            return _enum_member
        raise CheckpointError(
            f"refusing to load {self._source!r}: it names {module}.{name}, which checkpoint "
            f"metadata never contains (a crafted or foreign file; load only checkpoints you "
            f"trust)")


def check_metadata_is_safe(folder: str):
    """Unpickles ``folder/.metadata`` with :class:`RestrictedUnpickler` (nothing else is run);
    returns what it holds (torch's checkpoint ``Metadata``)."""
    path = os.path.join(folder, METADATA_FILENAME)
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint {folder!r} has no {METADATA_FILENAME} (not a "
                              f"torch_dist checkpoint, or a partial one)")
    try:
        with open(path, "rb") as handle:
            return RestrictedUnpickler(handle, path).load()
    except CheckpointError:
        raise
    except Exception as err:  # any malformed pickle: one line, never a traceback wall
        raise CheckpointError(f"checkpoint metadata {path!r} is unreadable "
                              f"({type(err).__name__}: {err})") from err


def check_common_is_safe(folder: str) -> None:
    """Reads ``folder/common.pt`` with ``weights_only=True`` (tensors and plain containers)."""
    path = os.path.join(folder, COMMON_FILENAME)
    if not os.path.isfile(path):
        return  # megatron-core reports a missing common.pt itself; the manifest lists it
    try:
        torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # an UnpicklingError names the refused global
        raise CheckpointError(f"refusing to load {path!r}: it holds more than tensors and plain "
                              f"containers ({type(err).__name__}: {one_line(err)[:200]})") from err


def shard_files(folder: str, metadata) -> set[str]:
    """The data files (``__R_I.distcp``) that ``metadata``, read from ``folder/.metadata``,
    stores tensors in: every one must be part of the checkpoint."""
    try:
        names = {info.relative_path for info in metadata.storage_data.values()}
        assert all(isinstance(name, str) for name in names)
    except (AttributeError, TypeError, AssertionError) as err:
        path = os.path.join(folder, METADATA_FILENAME)
        raise CheckpointError(f"checkpoint file {path!r} is unreadable: it does not name the "
                              f"checkpoint's data files ({type(err).__name__})") from err
    return names


def check_config(folder: str) -> None:
    """``folder/metadata.json`` is the JSON object megatron-core wrote for a torch_dist save."""
    path = os.path.join(folder, CONFIG_FILENAME)
    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
        problem = None if isinstance(config, dict) else "not a JSON object"
        if problem is None and not set(config) <= CONFIG_KEYS:
            problem = f"unknown keys {sorted(set(config) - CONFIG_KEYS)}"
        if problem is None and config.get("sharded_backend") != SHARDED_BACKEND:
            problem = (f"sharded_backend {config.get('sharded_backend')!r}, expected "
                       f"{SHARDED_BACKEND!r}")
    except (OSError, ValueError) as err:  # ValueError: bad JSON or bad UTF-8
        problem = f"{type(err).__name__}: {one_line(err)[:120]}"
    if problem is not None:
        raise CheckpointError(f"checkpoint file {path!r} is unreadable ({problem}); load "
                              f"another checkpoint")
