"""What identifies a ``--data-path`` entry's content, for the resume checks
(:mod:`~megatron.varlen_training.resume.consistency`).

- a file (JSONL, one ``.parquet`` or ``.arrow`` file): its size and SHA-256, streamed;
- a folder (Parquet shards, a ``datasets.save_to_disk`` folder): the same per file, for every
  file the SFT reader may read in it (``*.parquet``, ``*.arrow`` and save_to_disk's
  ``state.json``), combined into one SHA-256 over the files' names, sizes and hashes, so a
  changed, added, removed or renamed shard changes it; the per-file entries name the shard that
  changed;
- an indexed dataset prefix: its ``.idx`` file's SHA-256 and its ``.bin`` file's size (module
  docstring of resume/consistency.py: a corpus of terabytes is not hashed at every start);
- anything else (a blend weight): the entry as spelled.

A file is hashed once per process: the fingerprint is kept under (resolved path, size, mtime),
and a run that saves every few iterations reads each data file once, at its first save (or at
``--load``). A file rewritten in place gets a new mtime (or size) and is hashed again.
"""

from __future__ import annotations

import hashlib
import os

from megatron.varlen_training.checkpoint.integrity import HASH_ALGORITHM, file_digest
from megatron.varlen_training.datasets.sft_arrow import (
    ARROW_SUFFIX,
    PARQUET_SUFFIX,
    SAVE_TO_DISK_MARKER,
)

# The files of a folder the SFT reader may read (datasets/sft_arrow.py): Parquet shards, the
# Arrow files of a save_to_disk folder and the state.json that lists them.
FOLDER_DATA_SUFFIXES = (PARQUET_SUFFIX, ARROW_SUFFIX)
FOLDER_INDEX_FILES = (SAVE_TO_DISK_MARKER,)
FILES_KEY = "files"  # a folder's per-file entries: [name, size, sha256]
# Fingerprints this process computed: (resolved path, size, mtime) -> fingerprint.
_FINGERPRINTS: dict[tuple, dict] = {}


def data_fingerprint(entry: str) -> dict:
    """``{"path": resolved path, "size", "sha256"}`` of a ``--data-path`` entry (module
    docstring; a folder adds ``files``); ``{"path": entry}`` for one that is neither a file, a
    folder of data files nor an indexed prefix (a blend weight: compared as spelled)."""
    if os.path.isfile(entry):
        return file_fingerprint(entry)
    if os.path.isdir(entry):
        return folder_fingerprint(entry)
    if os.path.isfile(f"{entry}.idx") and os.path.isfile(f"{entry}.bin"):
        return _indexed_fingerprint(entry)
    return {"path": entry}


def file_fingerprint(path: str) -> dict:
    """``{"path", "size", "sha256"}`` of one file, hashed once per process (module docstring)."""
    real = os.path.realpath(path)
    stat = os.stat(real)
    key = (real, stat.st_size, stat.st_mtime_ns)
    if key not in _FINGERPRINTS:
        _FINGERPRINTS[key] = {"path": real, **file_digest(real)}
    return dict(_FINGERPRINTS[key])


def folder_data_files(folder: str) -> list[str]:
    """The names (sorted) of the files in ``folder`` the SFT reader may read."""
    return sorted(entry.name for entry in os.scandir(folder)
                  if entry.is_file() and (entry.name.endswith(FOLDER_DATA_SUFFIXES)
                                          or entry.name in FOLDER_INDEX_FILES))


def folder_fingerprint(folder: str) -> dict:
    """The folder's fingerprint (module docstring); ``{"path": folder}`` if it holds no data
    file (the reader refuses such a folder in one line anyway)."""
    real = os.path.realpath(folder)
    names = folder_data_files(real)
    if not names:
        return {"path": folder}
    combined = hashlib.sha256()
    files = []
    for name in names:
        entry = file_fingerprint(os.path.join(real, name))
        files.append([name, entry["size"], entry[HASH_ALGORITHM]])
        combined.update(f"{name}\0{entry['size']}\0{entry[HASH_ALGORITHM]}\n".encode())
    return {"path": real, "size": sum(size for _, size, _ in files),
            HASH_ALGORITHM: combined.hexdigest(), FILES_KEY: files}


def changed_file(saved: dict, mine: dict) -> str | None:
    """The first file of a folder fingerprint that differs between ``saved`` and ``mine`` (a
    changed, added or removed one), or None (not folders, or no single file to name)."""
    theirs = {name: (size, digest) for name, size, digest in saved.get(FILES_KEY) or ()}
    ours = {name: (size, digest) for name, size, digest in mine.get(FILES_KEY) or ()}
    for name in sorted(set(theirs) | set(ours)):
        if theirs.get(name) != ours.get(name):
            state = "is new" if name not in theirs else "is missing" if name not in ours \
                else "changed"
            return f"{name} {state}"
    return None


def _indexed_fingerprint(prefix: str) -> dict:
    index = file_fingerprint(f"{prefix}.idx")
    return {"path": os.path.realpath(prefix), "size": os.path.getsize(f"{prefix}.bin"),
            HASH_ALGORITHM: index[HASH_ALGORITHM]}
