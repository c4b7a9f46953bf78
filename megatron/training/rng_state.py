"""Per-rank random-number states, so that a resumed run draws the dropout masks an
uninterrupted run would have drawn (bit-exact resume with dropout).

Saved per rank (``rng/rank_NNNNN.pt`` in the checkpoint): Python's ``random``, numpy's global
generator, torch's CPU generator, the current CUDA generator when CUDA is present, and megatron's
tracked streams (``get_cuda_rng_tracker()``: the CUDA tracker on GPU, the CPU tracker of
:mod:`megatron.varlen.cpu_device` on CPU), together with the parallel layout they belong to.
They are restored only on the same layout (same rank count and TP/PP/CP sizes); on another
layout each rank keeps its freshly seeded streams and rank 0 says so once.
Files hold tensors and plain containers only and are read with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch

from megatron.core import parallel_state
from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

RNG_SUBDIR = "rng"


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
    torch.save(capture(), os.path.join(folder, name))
    return name


def load(folder: str) -> bool:
    """Restores this rank's states if the checkpoint has them for this layout.

    Returns whether they were restored (the same answer on every rank of one layout).
    """
    path = os.path.join(folder, rng_filename(torch.distributed.get_rank()))
    if not os.path.isfile(path):
        return False
    state = torch.load(path, weights_only=True)
    if state["layout"] != _layout():
        return False
    restore(state)
    return True
