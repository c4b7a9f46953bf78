"""Mamba's per-micro-batch index tensors, built on the host once and reused by every layer.

A Mamba layer under CP needs two permutations of the gathered sequence dim (rank-ordered CP
shards <-> token order, :mod:`megatron.varlen.packing.cp_split`'s zigzag rule) and, for a packed
micro-batch, megatron-core's per-token sequence index ``seq_idx`` (which stops the convolution
and the scan at sequence boundaries). All three follow from the pack's padded boundaries alone.

Computed on the device from the device boundaries (megatron-core's way), every Mamba layer would
read the boundaries back to the host (``nonzero``/``repeat_interleave`` sizes, ``int(cu[-1])``):
a device synchronisation per layer. Here they are computed from the host copies the data path
attaches to ``PackedSeqParams`` (:func:`~megatron.varlen.packing.packed_seq.host_boundaries`),
cached on that per-micro-batch object and moved to the device with an asynchronous copy: the
forward and backward read nothing back. An SBHD micro-batch (one sequence per batch row) needs
only the permutations, which depend on its shape alone and are cached per shape.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch

from megatron.core.packed_seq_params import PackedSeqParams
from megatron.varlen.packing.packed_seq import host_boundaries, host_to_device
from megatron.varlen.packing.cp_split import get_thd_rank_order

_CP_REORDER = "mamba-cp-reorder"  # kinds of the micro-batch cache's entries
_SEQ_IDX = "mamba-seq-idx"
# Distinct SBHD shapes whose permutations are kept (a run has one or two).
_SBHD_CACHE_SIZE = 16


@dataclass(frozen=True)
class CPReorder:
    """The two permutations of Mamba's CP all-to-all for one micro-batch and CP size."""

    total_tokens: int            # T: tokens of the whole padded pack
    restore: torch.Tensor        # [T] gathered rank-ordered rows -> token order
    rank_order: torch.Tensor     # [T] token order -> rank-ordered rows (inverse of restore)


def _build_reorder(cu_seqlens_padded: torch.Tensor, cp_size: int,
                   device: torch.device) -> CPReorder:
    rank_order = get_thd_rank_order(cu_seqlens_padded.long(), cp_size)
    restore = torch.argsort(rank_order)  # = cp_split.get_thd_restore_order, without a rebuild
    return CPReorder(total_tokens=int(cu_seqlens_padded[-1]),
                     restore=host_to_device(restore, device),
                     rank_order=host_to_device(rank_order, device))


@functools.lru_cache(maxsize=_SBHD_CACHE_SIZE)
def _sbhd_reorder(total_tokens: int, cp_size: int, device: str) -> CPReorder:
    """One sequence of ``total_tokens`` (each batch row of an SBHD micro-batch)."""
    return _build_reorder(torch.tensor([0, total_tokens]), cp_size, torch.device(device))


def cp_reorder(packed_seq_params: Optional[PackedSeqParams], cp_size: int, total_tokens: int,
               device: torch.device) -> CPReorder:
    """The CP permutations of a micro-batch (THD ``packed_seq_params``, or None for SBHD).

    Raises:
        ValueError: the gathered sequence dim does not hold the pack's padded token count.
    """
    if packed_seq_params is None:
        return _sbhd_reorder(total_tokens, cp_size, str(device))
    host = host_boundaries(packed_seq_params)
    reorder = host.cache.get((_CP_REORDER, cp_size, str(device)),
                             lambda: _build_reorder(host.cu_seqlens_padded, cp_size, device))
    if reorder.total_tokens != total_tokens:
        raise ValueError(f"the CP-gathered sequence has {total_tokens} tokens but "
                         f"cu_seqlens_q_padded ends at {reorder.total_tokens}")
    return reorder


def _build_seq_idx(cu_seqlens_padded: torch.Tensor, total_tokens: int,
                   device: torch.device) -> torch.Tensor:
    lengths = torch.cat([cu_seqlens_padded.long(), torch.tensor([total_tokens])]).diff()
    if bool((lengths < 0).any()):
        raise ValueError(f"the Mamba input has {total_tokens} tokens but cu_seqlens_q_padded "
                         f"ends at {int(cu_seqlens_padded[-1])}")
    seq_idx = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)
    return host_to_device(seq_idx.to(torch.int32).unsqueeze(0), device)


def packed_seq_idx(packed_seq_params: PackedSeqParams, total_tokens: int) -> torch.Tensor:
    """megatron-core's ``MambaMixer._create_packed_seq_idx``, from the host boundaries.

    [1, total_tokens] int32 on the device of the boundaries: token t belongs to padded sequence
    i (cu_seqlens_q_padded[i] <= t < cu_seqlens_q_padded[i+1]); tokens after the last boundary
    form one more sequence (index n), exactly as megatron-core numbers them.
    """
    padded = packed_seq_params.cu_seqlens_q_padded
    device = (packed_seq_params.cu_seqlens_q if padded is None else padded).device
    host = host_boundaries(packed_seq_params)
    return host.cache.get((_SEQ_IDX, total_tokens, str(device)),
                          lambda: _build_seq_idx(host.cu_seqlens_padded, total_tokens, device))
