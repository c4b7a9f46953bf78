"""Checkpoints that are published atomically and verified before they are trusted.

Publishing: a checkpoint is written into ``<root>/.iter_NNNNNNN.partial``, every file and the
folder are fsynced, and only then is the folder renamed to ``iter_NNNNNNN``; the tracker file
is replaced the same way (write a temporary file, fsync, ``os.replace``, fsync the folder). A
crash at any moment leaves either the previous checkpoint as latest or the new one complete,
never a half-written ``iter_*`` folder or an empty tracker.

Verification: ``manifest.json`` in each checkpoint lists every file with its size and SHA-256
(streamed in 1 MiB blocks; shared across ranks: each rank hashes the files it wrote at save and
a 1/world share at load). SHA-256 was the fastest of hashlib's hashes on the development CPU
(SHA-NI: ~0.45 GB/s per core hashing from memory, ~0.2 GB/s reading from disk on a loaded
2-core machine, vs ~0.2 GB/s for BLAKE2b), so the cost is about (checkpoint bytes per rank) /
(0.2-0.5 GB/s) at save and again at load. A missing, truncated or altered file is a
one-line :class:`CheckpointError` naming it, before any of its bytes are used.

Completeness: the manifest covers the whole checkpoint. Every file in the folder must be listed
(a file the manifest does not list was never verified: an emptied or edited manifest must not
let a corrupted shard through), and every file the checkpoint format needs must be listed
(:func:`check_complete`; the caller names them: megatron-core's fixed files, the shards
``.metadata`` names, one RNG file per saving rank). The manifest records the saving world size
for the latter. Malformed entries are refused before any is used.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil

from megatron.varlen_training.errors import CheckpointError

MANIFEST_FILENAME = "manifest.json"
MANIFEST_VERSION = 1
HASH_ALGORITHM = "sha256"
_READ_BLOCK = 1 << 20  # bytes hashed per read: streams files of any size in constant memory
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")
# Staging folders a save leaves behind when it is killed (``.iter_NNNNNNN.partial``, and the
# ``.old`` copy publish() swaps out): removed at the next save, never loaded.
STALE_STAGING = re.compile(r"\.iter_\d{7}\.partial(\.old)?")


def staging_dir(final_dir: str) -> str:
    """Where a checkpoint is written before it is published as ``final_dir``."""
    parent, name = os.path.split(os.path.normpath(final_dir))
    return os.path.join(parent, f".{name}.partial")


def file_digest(path: str) -> dict:
    """``{"size", "sha256"}`` of one file."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(_READ_BLOCK):
            digest.update(block)
    return {"size": os.path.getsize(path), HASH_ALGORITHM: digest.hexdigest()}


def fsync_file(path: str) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def fsync_dir(path: str) -> None:
    """Makes a rename or a new entry in ``path`` durable (no-op where folders cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def relative_files(folder: str) -> list[str]:
    """Every file under ``folder`` (and every link to a folder, which os.walk does not enter),
    as sorted paths relative to it."""
    found = []
    for parent, dirs, names in os.walk(folder):
        links = [d for d in dirs if os.path.islink(os.path.join(parent, d))]
        found += [os.path.relpath(os.path.join(parent, n), folder) for n in names + links]
    return sorted(found)


def digest_files(folder: str, names: list[str]) -> dict[str, dict]:
    """Fsyncs and hashes ``names`` (relative to ``folder``)."""
    entries = {}
    for name in names:
        path = os.path.join(folder, name)
        fsync_file(path)
        entries[name] = file_digest(path)
    return entries


def write_manifest(folder: str, entries: dict[str, dict], world_size: int) -> None:
    """``world_size``: the ranks that saved (each wrote its own RNG file)."""
    manifest = {"version": MANIFEST_VERSION, "algorithm": HASH_ALGORITHM,
                "world_size": world_size, "files": dict(sorted(entries.items()))}
    atomic_write_text(os.path.join(folder, MANIFEST_FILENAME),
                      json.dumps(manifest, indent=1) + "\n")


def _entry_problem(name: object, entry: object) -> str | None:
    """Why one manifest entry cannot be trusted, or None."""
    if not isinstance(name, str) or os.path.isabs(name) or ".." in name.split("/") \
            or os.path.normpath(name) != name:
        return "which is not a plain path inside the checkpoint folder"
    if not (isinstance(entry, dict) and type(entry.get("size")) is int and entry["size"] >= 0
            and isinstance(entry.get(HASH_ALGORITHM), str)
            and _HEX_DIGEST.fullmatch(entry[HASH_ALGORITHM])):
        return (f'whose entry is not {{"size": bytes, "{HASH_ALGORITHM}": hex digest}} '
                f"(got {str(entry)[:60]})")
    return None


def read_manifest(folder: str) -> tuple[dict[str, dict], int | None]:
    """The manifest's file entries and saving world size (None in manifests that predate it),
    or a CheckpointError saying why the checkpoint is unusable."""
    path = os.path.join(folder, MANIFEST_FILENAME)
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint {folder!r} has no {MANIFEST_FILENAME}: it was not "
                              f"completely written (or predates checksums); load another one")
    try:
        with open(path, encoding="utf-8") as handle:
            manifest = json.load(handle)
        files = manifest["files"]
        world_size = manifest.get("world_size")
        assert manifest["algorithm"] == HASH_ALGORITHM and isinstance(files, dict)
        assert world_size is None or (type(world_size) is int and world_size >= 1)
    except (ValueError, KeyError, TypeError, AttributeError, AssertionError) as err:
        raise CheckpointError(f"checkpoint manifest {path!r} is unreadable "
                              f"({type(err).__name__})") from err
    for name, entry in files.items():
        problem = _entry_problem(name, entry)
        if problem is not None:
            raise CheckpointError(f"checkpoint manifest {path!r} lists {name!r}, {problem}; "
                                  f"load another checkpoint")
    return files, world_size


def check_complete(folder: str, entries: dict[str, dict], required: dict[str, str]) -> None:
    """Every file in ``folder`` is listed in ``entries`` and every ``required`` name (name ->
    why it is needed) is listed; the first gap is a CheckpointError naming the file."""
    for name in relative_files(folder):
        if name != MANIFEST_FILENAME and name not in entries:
            raise CheckpointError(
                f"checkpoint file {os.path.join(folder, name)!r} is not listed in "
                f"{MANIFEST_FILENAME}: the manifest does not cover the whole checkpoint (edited, "
                f"or a file was added after the save); load another checkpoint")
    for name, why in sorted(required.items()):
        if name not in entries:
            raise CheckpointError(
                f"checkpoint file {os.path.join(folder, name)!r} is missing and not listed in "
                f"{MANIFEST_FILENAME} ({why}): the checkpoint is incomplete; load another "
                f"checkpoint")


def verify_files(folder: str, entries: dict[str, dict], names: list[str]) -> None:
    """Checks ``names`` against their manifest entries; the first mismatch raises."""
    for name in names:
        path = os.path.join(folder, name)
        want = entries[name]
        if not os.path.isfile(path):
            raise CheckpointError(f"checkpoint file {path!r} is missing (listed in "
                                  f"{MANIFEST_FILENAME})")
        size = os.path.getsize(path)
        if size != want["size"]:
            raise CheckpointError(f"checkpoint file {path!r} is truncated or altered: {size} "
                                  f"bytes, {want['size']} were written")
        if file_digest(path)[HASH_ALGORITHM] != want[HASH_ALGORITHM]:
            raise CheckpointError(f"checkpoint file {path!r} is corrupted: its {HASH_ALGORITHM} "
                                  f"differs from the one recorded at save")


def atomic_write_text(path: str, text: str) -> None:
    """Writes ``path`` so that readers see the old content or the new, never a partial file."""
    temporary = f"{path}.tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def remove_stale_staging(root: str) -> list[str]:
    """Removes the staging folders saves that were killed left in ``root``; returns their
    names. Only the saving process may call it: it would remove a concurrent save's staging."""
    stale = sorted(n for n in os.listdir(root) if STALE_STAGING.fullmatch(n)) \
        if os.path.isdir(root) else []
    for name in stale:
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    return stale


def publish(staging: str, final_dir: str) -> None:
    """Renames a complete ``staging`` folder to ``final_dir`` (replacing an older copy)."""
    fsync_dir(staging)
    parent = os.path.dirname(os.path.abspath(final_dir))
    if os.path.exists(final_dir):  # the same iteration saved again: swap, then drop the old one
        retired = f"{staging}.old"
        shutil.rmtree(retired, ignore_errors=True)
        os.replace(final_dir, retired)
        os.replace(staging, final_dir)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        os.replace(staging, final_dir)
    fsync_dir(parent)
