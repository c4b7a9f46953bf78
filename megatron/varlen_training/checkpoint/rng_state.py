"""Per-rank random-number states, so that a resumed run draws the dropout masks an
uninterrupted run would have drawn (bit-exact resume with dropout).

Saved per rank (``rng/rank_NNNNN.pt`` in the checkpoint): Python's ``random``, numpy's global
generator, torch's CPU generator, the current CUDA generator when CUDA is present, and megatron's
tracked streams (``get_cuda_rng_tracker()``: the CUDA tracker on GPU, the CPU tracker of
:mod:`megatron.varlen.platform.cpu_device` on CPU), together with the parallel layout they belong
to. They are restored only on the same layout (same rank count and TP/PP/CP sizes); on another
layout each rank keeps its freshly seeded streams and rank 0 says so once. Files hold tensors and
plain containers only and are read with ``torch.load(weights_only=True)``; a file that does not
unpickle that way, or does not hold this module's states, is a one-line
:class:`~megatron.varlen_training.errors.CheckpointError` naming it.
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch

from megatron.core import parallel_state
from megatron.core.tensor_parallel.random import get_cuda_rng_tracker
from megatron.varlen_training.errors import CheckpointError, one_line

RNG_SUBDIR = "rng"
STATE_KEYS = frozenset({"layout", "python", "numpy", "torch_cpu", "cuda", "tracker"})
LAYOUT_LENGTH = 4  # world, TP, PP, CP sizes
# What a state of the wrong form raises while it is restored (unpacking, tensor types/sizes).
_MALFORMED_STATE_ERRORS = (TypeError, ValueError, KeyError, IndexError, AttributeError,
                           RuntimeError)
_DETAIL_CHARS = 160


def rng_filename(rank: int) -> str:
    return os.path.join(RNG_SUBDIR, f"rank_{rank:05d}.pt")


def _layout() -> list[int]:
    return [torch.distributed.get_world_size(),
            parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_pipeline_model_parallel_world_size(),
            parallel_state.get_context_parallel_world_size()]


def capture() -> dict:
    """This rank's generator states as tensors and plain Python values."""
    version, mt_state, gauss = random.getstate()
    name, keys, position, has_gauss, cached = np.random.get_state()
    return {
        "layout": _layout(),
        "python": [version, list(mt_state), gauss],
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, cached],
        "torch_cpu": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        "tracker": {k: v.clone() for k, v in get_cuda_rng_tracker().get_states().items()},
    }


def restore(state: dict) -> None:
    version, mt_state, gauss = state["python"]
    random.setstate((version, tuple(mt_state), gauss))
    name, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), position, has_gauss, cached))
    torch.set_rng_state(state["torch_cpu"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    get_cuda_rng_tracker().set_states(state["tracker"])


def save(folder: str) -> str:
    """Writes this rank's states under ``folder``; returns the relative file name."""
    name = rng_filename(torch.distributed.get_rank())
    os.makedirs(os.path.join(folder, RNG_SUBDIR), exist_ok=True)
    # Through a Python file: a failed write (disk full) then carries its OSError, where
    # torch's own file writer reports only "unexpected pos".
    with open(os.path.join(folder, name), "wb") as handle:
        torch.save(capture(), handle)
    return name


def _malformed(path: str, why: str) -> CheckpointError:
    return CheckpointError(f"checkpoint file {path!r} holds no valid random states ({why}); "
                           f"load another checkpoint")


def _read(path: str) -> dict:
    """The states in ``path``, checked for form (not for values: see the trust model)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # refused globals, not a torch file, truncated: one line
        raise CheckpointError(f"checkpoint file {path!r} is unreadable ({type(err).__name__}: "
                              f"{one_line(err)[:_DETAIL_CHARS]}); load another checkpoint") \
            from err
    if not isinstance(state, dict) or set(state) != STATE_KEYS:
        keys = sorted(map(str, state)) if isinstance(state, dict) else type(state).__name__
        raise _malformed(path, f"expected the entries {sorted(STATE_KEYS)}, got {keys}")
    layout = state["layout"]
    if not (isinstance(layout, list) and len(layout) == LAYOUT_LENGTH
            and all(type(size) is int for size in layout)):
        raise _malformed(path, f"layout {str(layout)[:40]}")
    return state


def _check_tracker(path: str, tracker) -> None:
    """The tracked streams must be the ones this run created (same names, generator states)."""
    names = set(get_cuda_rng_tracker().get_states())
    if not (isinstance(tracker, dict) and set(tracker) == names
            and all(isinstance(v, torch.Tensor) for v in tracker.values())):
        got = sorted(map(str, tracker)) if isinstance(tracker, dict) else type(tracker).__name__
        raise _malformed(path, f"tracked streams {got}, this run has {sorted(names)}")


def load(folder: str) -> bool:
    """Restores this rank's states if the checkpoint has them for this layout.

    Returns whether they were restored (the same answer on every rank of one layout); a
    malformed file is a CheckpointError naming it.
    """
    path = os.path.join(folder, rng_filename(torch.distributed.get_rank()))
    if not os.path.isfile(path):
        return False
    state = _read(path)
    if state["layout"] != _layout():
        return False
    _check_tracker(path, state["tracker"])
    try:
        restore(state)
    except _MALFORMED_STATE_ERRORS as err:
        raise _malformed(path, f"{type(err).__name__}: {one_line(err)[:_DETAIL_CHARS]}") from err
    return True
