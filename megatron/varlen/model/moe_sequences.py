"""Which sequence each token the MoE router sees belongs to, and which tokens are real.

The router runs on this rank's share of a micro-batch: under packing a THD stream (every
sequence padded for its CP group, split in the zigzag CP layout over the micro-batch's dynamic
CP group, then cut into TP slices by sequence parallelism); without packing an SBHD batch
(column b is one sample, padded to --seq-length). A :class:`SequenceMap` tells, for each local
token, its sequence (-1 for padding and pad-only fillers) and the REAL length of every sequence,
plus the process groups over which one sequence's tokens are spread (the micro-batch's CP group
and, with sequence parallelism, the TP group): reducing a per-sequence statistic over those
groups gives the statistic of the whole sequence, whatever the layout.

Built once per micro-batch and reused by every MoE layer: a packed micro-batch's map on the host
from the boundaries the packing layer made (no device read), cached in its ``derived`` cache; an
unpacked micro-batch's map from its padding mask (with one all-reduce of the real lengths under
CP or SP), cached beside that mask (:func:`unpacked_micro_batch_cache`), the one object every
layer of a forward receives.

Legend: T = tokens of this rank's share (router input rows), n = sequences of the micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Sequence

import torch
from torch.utils.weak import WeakIdKeyDictionary

from megatron.varlen.attention.cp_group import resolve_cp_group
from megatron.varlen.packing.cp_split import get_thd_partition_indices
from megatron.varlen.packing.packed_seq import MicroBatchCache, host_boundaries, host_to_device

_SEQUENCE_MAP = "moe-sequence-map"  # kind of the cached map in a micro-batch's derived cache
# Unpacked micro-batches' caches, keyed by the layer-level padding mask (weakly: an entry goes
# with its mask, i.e. with the micro-batch). Module state, not an argument: megatron-core 0.16.1
# hands a layer nothing of an unpacked micro-batch but this mask (TransformerBlock.forward takes
# no extra keyword, and GPTModel builds its block itself, not from a spec), and a layer
# recomputed in backward runs after its model's forward has returned, with the same mask object.
_UNPACKED_CACHES = WeakIdKeyDictionary()
PADDING = -1  # sequence index of a padding or filler token


def sum_slots(seq_index: torch.Tensor, num_sequences: int) -> torch.Tensor:
    """[T] ``seq_index`` with :data:`PADDING` rows sent to slot ``num_sequences`` (a per-sequence
    sum's extra row, dropped after the sum)."""
    return torch.where(seq_index == PADDING, torch.full_like(seq_index, num_sequences),
                       seq_index)


@dataclass(frozen=True)
class SequenceMap:
    """One rank's router rows -> sequences.

    Attributes:
        seq_index: [T] int64 on the device: the row's sequence, :data:`PADDING` for padding
            and filler tokens.
        real_lengths: [n] float on the device: every sequence's real token count (the whole
            sequence, not this rank's share); 0 for pad-only fillers.
        groups: process groups one sequence's rows are spread over (reduce a per-sequence
            count over all of them to get the sequence's count); only groups of size > 1.
        counts_once: whether this rank adds per-sequence weights to logged sums (one rank per
            group of ranks sharing the micro-batch, so each sequence is counted once).
    """

    seq_index: torch.Tensor
    real_lengths: torch.Tensor
    groups: tuple
    counts_once: bool

    # Derived tensors are cached on the map (built once per micro-batch, read by every MoE
    # layer several times): each would otherwise be an operator call, a kernel on CUDA, per use.
    @cached_property
    def valid(self) -> torch.Tensor:
        """[T] bool: rows of real tokens."""
        return self.seq_index >= 0

    @cached_property
    def padding(self) -> torch.Tensor:
        """[T] bool: rows of padding (``~valid``; megatron-core's padding masks)."""
        return ~self.valid

    @cached_property
    def sum_slots(self) -> torch.Tensor:
        """[T] the row's slot in a per-sequence sum: its sequence, padding at slot n (dropped)."""
        return sum_slots(self.seq_index, self.num_sequences)

    @property
    def num_sequences(self) -> int:
        return int(self.real_lengths.numel())


def _group_size(group) -> int:
    return 1 if group is None else group.size()


def _group_rank(group) -> int:
    return 0 if group is None else group.rank()


def _sp_slice(num_rows: int, tp_group, sequence_parallel: bool) -> slice:
    """The rows of a CP-local stream this TP rank holds (sequence parallelism cuts it evenly)."""
    if not sequence_parallel or _group_size(tp_group) == 1:
        return slice(0, num_rows)
    share = num_rows // tp_group.size()
    return slice(tp_group.rank() * share, (tp_group.rank() + 1) * share)


def _reduce_groups(*groups) -> tuple:
    return tuple(group for group in groups if _group_size(group) > 1)


def _thd_host_map(cu_padded: torch.Tensor, real_lengths: torch.Tensor, cp_size: int,
                  cp_rank: int) -> torch.Tensor:
    """[T_cp] sequence index of each row of this CP rank's zigzag share, PADDING off the real
    tokens (padding after each sequence, filler sequences)."""
    positions = get_thd_partition_indices(cu_padded, cp_size, cp_rank)
    starts = cu_padded[:-1].long()
    seq = torch.searchsorted(starts, positions, right=True) - 1
    offset = positions - starts[seq]
    return torch.where(offset < real_lengths[seq], seq, torch.full_like(seq, PADDING))


def thd_sequence_map(packed_seq_params, static_cp_group, tp_group, sequence_parallel: bool,
                     device, shift: int = 0) -> SequenceMap:
    """The map of a packed micro-batch (cached in its ``derived`` cache); ``shift`` drops the
    last ``shift`` real tokens of each sequence (an MTP layer of that depth)."""
    cp_group = resolve_cp_group(packed_seq_params, static_cp_group)
    cp_size, cp_rank = _group_size(cp_group), _group_rank(cp_group)
    tp_size = _group_size(tp_group) if sequence_parallel else 1
    tp_rank = _group_rank(tp_group) if sequence_parallel else 0
    boundaries = host_boundaries(packed_seq_params)
    routed = getattr(packed_seq_params, "host_routed_lengths", None)

    def build() -> SequenceMap:
        cu_padded = boundaries.cu_seqlens_padded.long()
        lengths = (routed.long() if routed is not None
                   else (boundaries.cu_seqlens[1:] - boundaries.cu_seqlens[:-1]).long())
        lengths = (lengths - shift).clamp(min=0)
        rows = _thd_host_map(cu_padded, lengths, cp_size, cp_rank)
        rows = rows[_sp_slice(rows.numel(), tp_group, sequence_parallel)]
        return SequenceMap(
            seq_index=host_to_device(rows, device),
            real_lengths=host_to_device(lengths.to(torch.float32), device),
            groups=_reduce_groups(cp_group, tp_group if sequence_parallel else None),
            counts_once=cp_rank == 0 and tp_rank == 0)

    key = (_SEQUENCE_MAP, id(cp_group), cp_size, cp_rank, tp_size, tp_rank, str(device),
           shift)
    return boundaries.cache.get(key, build)


def unpacked_micro_batch_cache(padding_mask: torch.Tensor | None) -> MicroBatchCache | None:
    """The cache of the unpacked micro-batch whose layers receive ``padding_mask`` ([b, s], the
    object the model hands every layer of one forward; MoE layers see a new transposed view of
    it each), or None without a mask (the map is then built per layer)."""
    if padding_mask is None:
        return None
    cache = _UNPACKED_CACHES.get(padding_mask)
    if cache is None:
        cache = _UNPACKED_CACHES[padding_mask] = MicroBatchCache()
    return cache


def sbhd_sequence_map(padding_mask: torch.Tensor | None, shape: Sequence[int], cp_group,
                      tp_group, sequence_parallel: bool, device) -> SequenceMap:
    """The map of an unpacked [s, b] micro-batch: column b is sample b; ``padding_mask``
    ([s_local, b], True on padding) as megatron-core hands it to the MoE layer, or None (no
    padding). Real lengths are counted over the CP (and SP) group: a device all-reduce."""
    seq_len, batch = int(shape[0]), int(shape[1])
    if padding_mask is not None and padding_mask.shape[0] != seq_len:
        # A stage that did not scatter the mask for sequence parallelism (megatron-core does
        # it on the first pipeline stage only): keep this TP rank's rows.
        padding_mask = padding_mask[_sp_slice(padding_mask.shape[0], tp_group, True)]
    columns = torch.arange(batch, device=device).expand(seq_len, batch)
    valid = (torch.ones(seq_len, batch, dtype=torch.bool, device=device)
             if padding_mask is None else ~padding_mask.to(device=device, dtype=torch.bool))
    seq_index = torch.where(valid, columns, torch.full_like(columns, PADDING)).reshape(-1)
    groups = _reduce_groups(cp_group, tp_group if sequence_parallel else None)
    lengths = valid.sum(dim=0).to(torch.float32)
    for group in groups:
        torch.distributed.all_reduce(lengths, group=group)
    tp_rank = _group_rank(tp_group) if sequence_parallel else 0
    return SequenceMap(seq_index=seq_index, real_lengths=lengths, groups=groups,
                       counts_once=_group_rank(cp_group) == 0 and tp_rank == 0)


def build_sequence_map(packed_seq_params: Any, padding_mask, shape, static_cp_group, tp_group,
                       sequence_parallel: bool, device, shift: int = 0,
                       unpacked_cache: MicroBatchCache | None = None) -> SequenceMap:
    """THD map when the micro-batch is packed, else the SBHD map of ``shape`` ([s, b, ...]);
    ``shift``: see :func:`thd_sequence_map` (unpacked, the padding mask carries it).
    ``unpacked_cache``: the unpacked micro-batch's cache (:func:`unpacked_micro_batch_cache`),
    where its map is kept for the next layers."""
    if packed_seq_params is not None and getattr(packed_seq_params, "qkv_format", None) == "thd":
        return thd_sequence_map(packed_seq_params, static_cp_group, tp_group, sequence_parallel,
                                device, shift)

    def build() -> SequenceMap:
        return sbhd_sequence_map(padding_mask, shape, static_cp_group, tp_group,
                                 sequence_parallel, device)

    if unpacked_cache is None:
        return build()
    # The layer-level mask decides the rest: the router's mask is its transposed view (cut to
    # this TP rank's rows when the stage did not scatter it), so shape and groups complete it.
    key = (_SEQUENCE_MAP, tuple(int(size) for size in shape), id(static_cp_group),
           id(tp_group), sequence_parallel, str(device))
    return unpacked_cache.get(key, build)
