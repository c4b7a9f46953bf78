"""Which checkpoint formats this fork writes and reads, and how a folder in another one is told.

Megatron-LM's ``--ckpt-format`` chooses among ``torch`` (the legacy format: one
``mp_rank_XX/model_optim_rng.pt`` per model-parallel rank), ``torch_dist`` (megatron-core's
dist_checkpointing with the PyTorch distributed backend: ``.metadata``, ``*.distcp`` shards,
``metadata.json``, ``common.pt``), ``zarr`` (dist_checkpointing with the zarr backend, deprecated
in megatron-core), ``torch_dcp`` and ``fsdp_dtensor`` (plain ``torch.distributed.checkpoint``:
``.metadata`` and shards, without megatron-core's ``metadata.json``). This fork writes and reads
``torch_dist`` only, with its own files beside megatron-core's (``manifest.json``,
``run_args.json``, the RNG files: the package docstring), so a folder without ``manifest.json`` was
not saved by it. Such a folder is refused in one line naming the format it is in, before
anything in it is parsed.
"""

from __future__ import annotations

import json
import os

from megatron.varlen_training.checkpoint.integrity import MANIFEST_FILENAME
from megatron.varlen_training.checkpoint.rng_state import RNG_SUBDIR
from megatron.varlen_training.checkpoint.safe_load import CONFIG_FILENAME, METADATA_FILENAME
from megatron.varlen_training.errors import CheckpointError
from megatron.varlen_training.load_options import SUPPORTED_FORMAT
from megatron.varlen_training.resume.run_args_keys import RUN_ARGS_FILENAME

_LEGACY_PREFIX = "mp_rank_"  # the legacy format's per-rank folders (mp_rank_00, mp_rank_00_001)
_OWN_FILES = {RUN_ARGS_FILENAME, RNG_SUBDIR}  # only this fork's saves write them
_BACKEND_KEY = "sharded_backend"  # megatron-core's metadata.json: the dist_checkpointing backend


def _config_backend(folder: str) -> str | None:
    """The backend megatron-core's ``metadata.json`` names, or None without a readable one (the
    loader's own checks report a malformed file)."""
    try:
        with open(os.path.join(folder, CONFIG_FILENAME), encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError):
        return None
    backend = config.get(_BACKEND_KEY) if isinstance(config, dict) else None
    return backend if isinstance(backend, str) else None


def saved_format(folder: str) -> tuple[str, str] | None:
    """The format of a checkpoint folder that this fork did not save, and what shows it; None
    for a folder with this fork's manifest (or nothing recognisable: the loader's checks name
    what is missing)."""
    if os.path.isfile(os.path.join(folder, MANIFEST_FILENAME)):
        return None
    names = os.listdir(folder)
    legacy = sorted(name for name in names if name.startswith(_LEGACY_PREFIX))
    if legacy:
        return "torch", f"legacy per-rank folders such as {legacy[0]}/"
    backend = _config_backend(folder)
    if backend == SUPPORTED_FORMAT and _OWN_FILES & set(names):
        return None  # this fork's, incomplete: the loader names the missing manifest
    if backend is not None:
        return backend, f"{CONFIG_FILENAME} names backend {backend!r}, without {MANIFEST_FILENAME}"
    if METADATA_FILENAME in names:
        # Both formats write plain torch.distributed.checkpoint files: the folder cannot tell.
        return "torch_dcp or fsdp_dtensor", (f"torch.distributed.checkpoint files without "
                                             f"megatron-core's {CONFIG_FILENAME}")
    return None


def check_saved_format(folder: str) -> None:
    """A one-line CheckpointError if ``folder`` holds a checkpoint in a format this fork does
    not load (module docstring)."""
    found = saved_format(folder)
    if found is None:
        return
    name, evidence = found
    origin = ("saved by Megatron-LM or another tool, not by this fork"
              if name == SUPPORTED_FORMAT else f"Megatron-LM's --ckpt-format {name}")
    raise CheckpointError(
        f"--load: checkpoint {folder!r} is {origin} ({evidence}); this fork loads only the "
        f"--ckpt-format {SUPPORTED_FORMAT} checkpoints it saves itself (with {MANIFEST_FILENAME} "
        f"and run_args.json); start from a Hugging Face checkpoint (--hf-checkpoint) or load "
        f"another one")
