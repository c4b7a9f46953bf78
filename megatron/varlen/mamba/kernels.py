"""Which Mamba kernels run: mamba_ssm's / causal_conv1d's when they import, else our twins.

Like the attention adapter (``varlen/attention/te_adapter.py``): the fused GPU kernels
(Triton for the SSD scan, CUDA for the convolution) are used when both packages import and
CUDA is available; otherwise the plain-torch twins in this package, which compute the same
function (tested against a float64 step-by-step recurrence). ``MEGATRON_VARLEN_MAMBA_KERNELS``
forces a choice: ``torch`` (the twins) or ``cuda`` (the real kernels, an ImportError if absent).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Callable

import torch

KERNELS_ENV = "MEGATRON_VARLEN_MAMBA_KERNELS"
TORCH_KERNELS = "torch"
CUDA_KERNELS = "cuda"


@dataclasses.dataclass(frozen=True)
class MambaKernels:
    """The three training-time entry points of the Mamba mixer and where they come from."""

    source: str  # TORCH_KERNELS or CUDA_KERNELS
    mamba_chunk_scan_combined: Callable
    mamba_split_conv1d_scan_combined: Callable
    causal_conv1d_fn: Callable


def torch_kernels() -> MambaKernels:
    """The plain-torch twins (any device)."""
    from megatron.varlen.mamba.causal_conv import causal_conv1d_fn
    from megatron.varlen.mamba.split_conv_scan import mamba_split_conv1d_scan_combined
    from megatron.varlen.mamba.ssd_scan import mamba_chunk_scan_combined

    return MambaKernels(TORCH_KERNELS, mamba_chunk_scan_combined,
                        mamba_split_conv1d_scan_combined, causal_conv1d_fn)


def cuda_kernels() -> MambaKernels:
    """mamba_ssm's and causal_conv1d's kernels; ImportError when either package is missing."""
    from causal_conv1d import causal_conv1d_fn
    from mamba_ssm.ops.triton.ssd_combined import (
        mamba_chunk_scan_combined, mamba_split_conv1d_scan_combined,
    )

    return MambaKernels(CUDA_KERNELS, mamba_chunk_scan_combined,
                        mamba_split_conv1d_scan_combined, causal_conv1d_fn)


@functools.lru_cache(maxsize=None)
def select_kernels(choice: str | None = None) -> MambaKernels:
    """The kernels to use: ``choice`` (or the env variable), else CUDA ones when they import."""
    choice = choice or os.environ.get(KERNELS_ENV)
    if choice == TORCH_KERNELS:
        return torch_kernels()
    if choice == CUDA_KERNELS:
        return cuda_kernels()
    if choice is not None:
        raise ValueError(f"{KERNELS_ENV}={choice!r}: expected {TORCH_KERNELS!r} or "
                         f"{CUDA_KERNELS!r}")
    if torch.cuda.is_available():
        try:
            return cuda_kernels()
        except ImportError:
            pass
    return torch_kernels()
