"""A whole-document blend's sample-to-dataset table, cached under ``--data-cache-path``.

The table (megatron-core's blending indices: 2 + 8 bytes per sample) depends only on the
per-sample weights and the sample count. Without a cache folder every rank builds it in its own
memory, as megatron-core's ``BlendedDataset`` does without ``path_to_cache``; with one, as there:
rank 0 builds it once and saves it, and every rank memory-maps the saved arrays (a node's ranks
then share one copy in the page cache, and only the pages a rank reads are loaded). Files are
named by a hash of what they hold, so another blend never reads a stale table; they are written
under a temporary name and renamed, so a reader never sees half a file. A rank that cannot find
them (several nodes, a cache folder on each node's own disk) stops every rank in one line.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable

import numpy as np
import torch

from megatron.varlen_training.errors import agree_on_errors

BuildIndices = Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]]
# What the file names start with (megatron-core names its own ``<hash>-BlendedDataset-...``).
FILE_PREFIX = "WholeDocumentBlend"
INDEX_FILES = ("dataset_index.npy", "dataset_sample_index.npy")


def cache_paths(cache_dir: str, weights: np.ndarray, num_samples: int,
                split: str) -> tuple[str, str]:
    """The two files holding the table of ``weights`` (float64, exact bits) over
    ``num_samples`` samples of ``split``."""
    description = np.asarray(weights, dtype=np.float64).tobytes() + f"{num_samples}".encode()
    digest = hashlib.md5(description, usedforsecurity=False).hexdigest()
    return tuple(os.path.join(cache_dir, f"{digest}-{FILE_PREFIX}-{split}-{name}")
                 for name in INDEX_FILES)


def cached_blending_indices(build: BuildIndices, weights: np.ndarray, num_samples: int,
                            cache_dir: str | None, split: str) -> tuple[np.ndarray, np.ndarray]:
    """``build(weights, num_samples)``, in memory without ``cache_dir``, else saved there by
    rank 0 (unless saved before) and memory-mapped on every rank. Every rank calls this (a
    world collective: a failure on rank 0, such as a full disk, is a one-line error on all)."""
    if cache_dir is None:
        return build(weights, num_samples)
    paths = cache_paths(cache_dir, weights, num_samples, split)
    agree_on_errors(_save_once, build, weights, num_samples, paths)
    return agree_on_errors(_mapped, paths)


def _mapped(paths: tuple[str, str]) -> tuple[np.ndarray, np.ndarray]:
    """The saved table, memory-mapped; missing where rank 0 saved it (another node's disk)."""
    try:
        return tuple(np.load(path, mmap_mode="r") for path in paths)
    except FileNotFoundError as err:
        raise OSError(f"--data-cache-path: the whole-document blend's sample table that rank 0 "
                      f"saved is not at {err.filename} on this rank: with several nodes, "
                      f"--data-cache-path must be a folder every node sees") from None


def _save_once(build: BuildIndices, weights: np.ndarray, num_samples: int,
               paths: tuple[str, str]) -> None:
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    if rank != 0 or all(os.path.isfile(path) for path in paths):
        return
    arrays = build(weights, num_samples)
    for path, array in zip(paths, arrays):
        partial = f"{path}.{os.getpid()}.tmp"
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(partial, "wb") as handle:
                np.save(handle, array)
            os.replace(partial, path)
        except OSError as err:  # a full or read-only disk: one line on every rank
            raise OSError(f"--data-cache-path: cannot save the whole-document blend's sample "
                          f"table ({array.nbytes} bytes) as {path}: {err.strerror or err}; "
                          f"choose a writable --data-cache-path with room for it") from None
