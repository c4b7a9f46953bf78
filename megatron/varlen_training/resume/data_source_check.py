"""A resume reads the data it was trained on: each ``--data-path`` entry is compared by its
content fingerprint (:mod:`~megatron.varlen_training.data_fingerprints`), not by its spelling;
another content is refused in one line unless ``--override-data-fingerprint``.
"""

from __future__ import annotations

import os

from megatron.varlen_training.checkpoint.integrity import HASH_ALGORITHM
from megatron.varlen_training.config import RunConfig
from megatron.varlen_training.data_fingerprints import changed_file, data_fingerprint
from megatron.varlen_training.errors import CheckpointError
from megatron.varlen_training.resume.run_args_keys import DATA_SOURCES_KEY
from megatron.varlen_training.resume.run_args_record import data_entries

_SHORT_HASH = 12  # hex digits of a data fingerprint shown in messages


def _describe_source(spelled: str, source: dict) -> str:
    if HASH_ALGORITHM not in source:
        return repr(spelled)
    files = f"{len(source['files'])} files, " if source.get("files") else ""
    return (f"{spelled!r} ({source['path']}: {files}{source.get('size')} bytes, "
            f"{HASH_ALGORITHM} {str(source[HASH_ALGORITHM])[:_SHORT_HASH]}...)")


def _same_source(saved: dict, mine: dict) -> bool:
    """Files: the same content wherever it lies; other entries: the same spelling."""
    if HASH_ALGORITHM in saved and HASH_ALGORITHM in mine:
        return (saved.get("size"), saved[HASH_ALGORITHM]) == (mine["size"],
                                                               mine[HASH_ALGORITHM])
    if saved.get("path") == mine.get("path"):
        return True
    # A folder recorded before folders were fingerprinted: its spelling, against the content
    # fingerprint's resolved path.
    return HASH_ALGORITHM not in saved and isinstance(saved.get("path"), str) \
        and os.path.realpath(saved["path"]) == mine.get("path")


def check_data_sources(saved: dict, run: RunConfig) -> str | None:
    """Refuses ``--data-path`` files whose content differs from the checkpoint's, unless
    ``--override-data-fingerprint`` (then returns a note saying what was accepted)."""
    data_path = data_entries(run)
    spelled_saved = saved.get("data_entries") or saved.get("data_path") or []
    saved_sources = saved.get(DATA_SOURCES_KEY)
    if saved_sources is None:  # saved before fingerprints: compare the resolved paths
        saved_sources = [{"path": os.path.realpath(entry)} for entry in spelled_saved]
        mine = [{"path": os.path.realpath(entry)} for entry in data_path]
    else:
        mine = [data_fingerprint(entry) for entry in data_path]
    if len(saved_sources) == len(mine) and all(map(_same_source, saved_sources, mine)):
        return None
    index = next((i for i, (a, b) in enumerate(zip(saved_sources, mine)) if not _same_source(a, b)),
                 min(len(saved_sources), len(mine)))
    theirs = (_describe_source(spelled_saved[index] if index < len(spelled_saved) else "?",
                               saved_sources[index]) if index < len(saved_sources) else "nothing")
    ours = (_describe_source(data_path[index], mine[index]) if index < len(mine)
            else "nothing")
    difference = f"--data-path entry {index + 1} is {ours}, the checkpoint was trained on {theirs}"
    shard = changed_file(saved_sources[index], mine[index]) \
        if index < min(len(saved_sources), len(mine)) else None
    if shard is not None:
        difference += f" (in the folder, {shard})"
    if run.checkpoint.override_data_fingerprint:
        return f"--override-data-fingerprint: resuming on other data ({difference})"
    raise CheckpointError(
        f"--load: {difference}: other data would change the samples the resumed run reads; "
        f"restore the checkpoint's data, or pass --override-data-fingerprint to train on this "
        f"data deliberately")
