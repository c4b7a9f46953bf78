"""The per-micro-batch attention plan: which local query rows attend which key ranges.

Pure host-side code. From the pack's boundaries (``cu_seqlens`` real, ``cu_seqlens_padded``
padded, both of the WHOLE pack) and the CP size and rank, it lays out ONE variable-length
kernel call (:mod:`megatron.varlen.attention.varlen_kernel`) that computes exactly what the
reference attention computes:

* The zigzag layout (:mod:`megatron.varlen.packing.cp_split`): every padded sequence of length P
  is cut into 2c chunks of ``P/2c`` tokens; CP rank r holds chunks r and 2c-1-r, in that order.
* A query chunk covering positions [a, b) of its sequence (real length L) becomes one kernel
  segment: its REAL rows [a, e), e = min(b, L), against the key PREFIX [0, e) of the same
  sequence (causal) or all real keys [0, L) (full attention). The kernel's causal mask is
  bottom-right aligned, so row j of the segment sees keys 0 .. a + j: exactly the causal mask
  at global positions. A chunk with no real row (a >= L) is no segment: its rows stay zero,
  as the reference returns for padding rows.
* A causal sliding window of ``w`` earlier keys (:mod:`megatron.varlen.attention.sliding_window`)
  trims the prefix to [max(0, a - w), e): no row of the chunk sees a key before a - w, and the
  kernel's bottom-right window ``(w, 0)`` then gives row j keys a + j - w .. a + j, again the
  global positions.
* Keys come from the all-gathered K/V of the CP group (rank-ordered shards), picked with one
  index (``key_index``) into that concatenation; queries are picked from the local shard with
  ``query_index`` and the kernel's output is scattered back to those rows.

Built ONCE per micro-batch (and CP group) from host values the schedule already has, then
reused by every layer: no device->host copy in the forward or backward pass.

Shape legend:
    T   = tokens of the whole padded pack; T_r = T / c tokens on this rank
    T_q = real query rows of this rank (kernel rows); T_k = gathered key rows (kernel keys)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from megatron.varlen.packing.cp_split import CHUNKS_PER_RANK, concat_ranges
from megatron.varlen.packing.packed_seq import host_boundaries, host_to_device


@dataclass(frozen=True)
class AttentionPlan:
    """One kernel call for one rank's tokens of one micro-batch (host ints + index tensors)."""

    cp_size: int
    cp_rank: int
    causal: bool
    local_tokens: int                  # T_r: rows of the local q/k/v shard
    query_index: Optional[torch.Tensor]  # [T_q] local rows given to the kernel; None = all
    key_index: Optional[torch.Tensor]    # [T_k] rows of the rank-ordered gathered K/V; None = all
    cu_seq_q: torch.Tensor             # [m+1] int32 kernel query boundaries
    cu_seq_k: torch.Tensor             # [m+1] int32 kernel key boundaries
    max_q: int
    max_k: int
    num_segments: int
    window_left: Optional[int] = None  # a causal sliding window's earlier keys; None: all

    def to(self, device: torch.device) -> "AttentionPlan":
        """The same plan with its tensors on ``device`` (pinned, asynchronous copies on CUDA)."""
        move = lambda t: None if t is None else host_to_device(t, device)
        return AttentionPlan(
            cp_size=self.cp_size, cp_rank=self.cp_rank, causal=self.causal,
            local_tokens=self.local_tokens, query_index=move(self.query_index),
            key_index=move(self.key_index), cu_seq_q=move(self.cu_seq_q),
            cu_seq_k=move(self.cu_seq_k), max_q=self.max_q, max_k=self.max_k,
            num_segments=self.num_segments, window_left=self.window_left)


def _ranges(starts: Sequence[int], lengths: Sequence[int]) -> torch.Tensor:
    """``cat([arange(s, s + n) for s, n in zip(starts, lengths)])`` of host ints, int64 (the
    CP split's :func:`~megatron.varlen.packing.cp_split.concat_ranges`)."""
    return concat_ranges(torch.tensor(list(starts), dtype=torch.int64),
                         torch.tensor(list(lengths), dtype=torch.int64))


def _is_identity_run(starts: Sequence[int], lengths: Sequence[int], size: int) -> bool:
    """Whether :func:`_ranges` of these runs is ``arange(size)``: decided on the host ints,
    without building (and comparing) a tensor of ``size`` rows."""
    position = 0
    for start, length in zip(starts, lengths):
        if length == 0:
            continue
        if start != position:
            return False
        position += length
    return position == size


def _index_or_none(starts: Sequence[int], lengths: Sequence[int],
                   size: int) -> Optional[torch.Tensor]:
    """The row index of the runs, or None where it would pick every one of ``size`` rows in
    order (the kernel then takes the tensor as it is)."""
    return None if _is_identity_run(starts, lengths, size) else _ranges(starts, lengths)


def _cumulative(lengths: Sequence[int]) -> torch.Tensor:
    return torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0).to(torch.int32)


def local_chunks(padded_len: int, cp_size: int, cp_rank: int) -> list[tuple[int, int]]:
    """[start, end) positions, within a sequence, of the chunks ``cp_rank`` holds (in order)."""
    if cp_size == 1:
        return [(0, padded_len)]
    chunk = padded_len // (CHUNKS_PER_RANK * cp_size)
    mirrored = CHUNKS_PER_RANK * cp_size - 1 - cp_rank
    return [(cp_rank * chunk, (cp_rank + 1) * chunk), (mirrored * chunk, (mirrored + 1) * chunk)]


def gathered_row(stream_pos: int, padded_starts: Sequence[int], padded_lens: Sequence[int],
                 seq: int, cp_size: int) -> int:
    """Row of stream position ``stream_pos`` (inside sequence ``seq``) in the rank-ordered
    concatenation of every CP rank's shard."""
    within = stream_pos - padded_starts[seq]
    if cp_size == 1:
        return stream_pos
    chunk = padded_lens[seq] // (CHUNKS_PER_RANK * cp_size)
    index, offset = divmod(within, chunk)
    owner = min(index, CHUNKS_PER_RANK * cp_size - 1 - index)
    second = index != owner  # the owner's mirrored (second) chunk
    shard_len = padded_starts[-1] // cp_size  # padded_starts carries T as its last entry
    local_start = padded_starts[seq] // cp_size
    return owner * shard_len + local_start + (chunk if second else 0) + offset


def _key_rows(start_pos: int, count: int, padded_starts, padded_lens, seq, cp_size):
    """(starts, lengths) runs of gathered rows for stream positions [start_pos, +count)."""
    if cp_size == 1:
        return [start_pos], [count]
    chunk = padded_lens[seq] // (CHUNKS_PER_RANK * cp_size)
    starts, lengths = [], []
    pos, end = start_pos, start_pos + count
    while pos < end:  # one run per chunk crossed: chunks are contiguous within a shard
        within = pos - padded_starts[seq]
        run = min(end - pos, chunk - within % chunk)
        starts.append(gathered_row(pos, padded_starts, padded_lens, seq, cp_size))
        lengths.append(run)
        pos += run
    return starts, lengths


def build_attention_plan(
    cu_seqlens: Sequence[int], cu_seqlens_padded: Sequence[int], cp_size: int, cp_rank: int,
    causal: bool = True, window_left: Optional[int] = None,
) -> AttentionPlan:
    """The kernel call for ``cp_rank``'s tokens (see the module docstring). Host only.

    Args:
        cu_seqlens: [n+1] cumulative REAL lengths of the whole pack (ints or a host tensor).
        cu_seqlens_padded: [n+1] cumulative PADDED lengths of the whole pack.
        cp_size, cp_rank: the micro-batch's CP group size and this rank's place in it.
        causal: causal within each sequence (else full attention over its real tokens).
        window_left: a causal sliding window: each query sees this many earlier keys (None:
            all of them).

    Raises:
        ValueError: malformed boundaries (a padded length below its real length, or not
            divisible by 2*cp_size when cp_size > 1); a window without causal attention.
    """
    if window_left is not None and (not causal or window_left < 0):
        raise ValueError(f"a sliding window of {window_left} earlier keys needs causal "
                         f"attention and a width >= 0")
    real = [int(x) for x in cu_seqlens]
    padded = [int(x) for x in cu_seqlens_padded]
    if len(real) != len(padded) or len(padded) < 1:
        raise ValueError("cu_seqlens and cu_seqlens_padded need the same n+1 entries")
    divisor = CHUNKS_PER_RANK * cp_size if cp_size > 1 else 1
    padded_lens = [b - a for a, b in zip(padded, padded[1:])]
    real_lens = [b - a for a, b in zip(real, real[1:])]
    for i, (p, r) in enumerate(zip(padded_lens, real_lens)):
        if r < 0 or p < r:
            raise ValueError(f"sequence {i}: real length {r} must be in [0, padded {p}]")
        if p % divisor:
            raise ValueError(f"sequence {i} has padded length {p}, not divisible by 2*cp_size "
                             f"= {divisor}")
    q_starts, q_lens, k_starts, k_lens, seg_q, seg_k = [], [], [], [], [], []
    local_offset = 0
    for seq, (p, length) in enumerate(zip(padded_lens, real_lens)):
        for slot, (a, b) in enumerate(local_chunks(p, cp_size, cp_rank)):
            end = min(b, length)
            if end > a:
                key_from = 0 if window_left is None else max(0, a - window_left)
                key_len = (end if causal else length) - key_from
                q_starts.append(local_offset + slot * (b - a))  # chunks sit back to back
                q_lens.append(end - a)
                starts, lengths = _key_rows(padded[seq] + key_from, key_len, padded,
                                            padded_lens, seq, cp_size)
                k_starts += starts
                k_lens += lengths
                seg_q.append(end - a)
                seg_k.append(key_len)
        local_offset += p // cp_size
    local_tokens = padded[-1] // cp_size
    return AttentionPlan(
        cp_size=cp_size, cp_rank=cp_rank, causal=causal, window_left=window_left,
        local_tokens=local_tokens,
        query_index=_index_or_none(q_starts, q_lens, local_tokens),
        key_index=_index_or_none(k_starts, k_lens, padded[-1]),
        cu_seq_q=_cumulative(seg_q), cu_seq_k=_cumulative(seg_k),
        max_q=max(seg_q, default=0), max_k=max(seg_k, default=0), num_segments=len(seg_q))


_ATTENTION_PLAN = "attention-plan"  # kind of the micro-batch cache's entry


def attention_plan(params, cp_size: int, cp_rank: int, causal: bool, device: torch.device,
                   window_left: Optional[int] = None) -> AttentionPlan:
    """The plan of ``params``' micro-batch for one CP place, window and device: built from its
    host boundaries on first use, then reused by every layer with that window (the
    micro-batch cache, :class:`~megatron.varlen.packing.packed_seq.MicroBatchCache`)."""
    host = host_boundaries(params)
    return host.cache.get(
        (_ATTENTION_PLAN, cp_size, cp_rank, causal, window_left, str(device)),
        lambda: build_attention_plan(host.cu_seqlens.tolist(), host.cu_seqlens_padded.tolist(),
                                     cp_size, cp_rank, causal, window_left).to(device))
