"""RoPE of a packed (THD) micro-batch from ONE cos/sin table per micro-batch.

megatron-core 0.16.1's unfused THD RoPE (``rope_utils._apply_rotary_pos_emb_thd``) works per
sequence in EVERY layer, for q and again for k: it reads the boundaries with ``.tolist()``,
slices the frequency table per sequence (two slices under CP), concatenates the slices and
takes cos and sin of the result. That is host work O(number of sequences) per layer.

Here the same numbers come from one table per micro-batch:

* :func:`rope_positions`: the row of the frequency table of each of this rank's tokens, from
  the host boundaries. It is the position within the token's padded sequence (padding slots
  continue the count, as megatron-core gives them) in the zigzag CP layout of
  :mod:`megatron.varlen.packing.cp_split`. When the frequency table has exactly one row per
  token of the pack (megatron-core's "exact mapping" case, ``freqs.size(0) == cu_seqlens[-1]``),
  the row is the token's place in the whole pack, as there.
* :func:`packed_rope_table`: ``cos``/``sin`` of those rows, times ``mscale`` (YaRN), cast to the
  activation dtype, built once per micro-batch, CP place, frequency table and dtype in the
  micro-batch cache (:class:`~megatron.varlen.packing.packed_seq.MicroBatchCache`) and reused
  by every layer; the positions go to the device once (``host_to_device``).
* :meth:`PackedRopeTable.rotate`: per layer, ``t * cos + rotate_half(t) * sin`` (and the
  untouched ``t_pass`` of ``rotary_percent < 1`` appended; with nothing to append, no copy).

The formula, the order of the operations and the casts are megatron-core's (cos and sin of the
float32 frequencies, times mscale, then the cast), so the result is bit for bit the same; the
tests compare with megatron-core's ``apply_rotary_pos_emb``.

Shape legend: T_r = this rank's tokens of the pack, H = heads, D = head dim, R = rotary dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from megatron.varlen.packing.cp_split import get_thd_partition_indices
from megatron.varlen.packing.packed_seq import host_boundaries, host_to_device

_ROPE_TABLE = "rope-table"  # kind of the micro-batch cache's entry


def rotate_half(t: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """``t`` [..., R] with each rotary pair (a, b) turned into (-b, a): the sine term's partner.

    The pairs are those of megatron-core 0.16.1's RoPE (its private ``rope_utils._rotate_half``,
    which we do not import: a private helper may change or vanish in any release): channel i and
    i + R/2 (halves), or channels 2i and 2i + 1 (``interleaved``). Its operations (negate, then
    cat or stack) in its order, so that the result is bit for bit the same; unlike it, any number
    of leading dimensions.
    """
    if not interleaved:
        first, second = torch.chunk(t, 2, dim=-1)
        return torch.cat((-second, first), dim=-1)
    even, odd = t[..., ::2], t[..., 1::2]
    return torch.stack((-odd, even), dim=-1).flatten(-2)


def rope_positions(cu_seqlens_padded: torch.Tensor, cp_size: int, cp_rank: int,
                   exact_mapping: bool = False) -> torch.Tensor:
    """[T_r] int64 (host): the frequency-table row of each token ``cp_rank`` holds.

    Args:
        cu_seqlens_padded: [n+1] host int tensor, cumulative PADDED lengths of the whole pack
            (megatron-core's THD RoPE takes the padded boundaries too).
        cp_size, cp_rank: the micro-batch's CP group size and this rank's place in it.
        exact_mapping: the row is the token's place in the whole pack (megatron-core's case of
            a table with one row per packed token) instead of its place in its sequence.
    """
    stream = get_thd_partition_indices(cu_seqlens_padded, cp_size, cp_rank)  # places in the pack
    if exact_mapping:
        return stream
    padded = cu_seqlens_padded.long()
    local_lengths = (padded[1:] - padded[:-1]) // cp_size
    starts = torch.repeat_interleave(padded[:-1], local_lengths, output_size=stream.numel())
    return stream - starts


@dataclass(frozen=True)
class PackedRopeTable:
    """cos and sin of one micro-batch's rows, ready to multiply (see the module docstring)."""

    freqs: torch.Tensor  # the frequency table they come from (kept alive: its id is in the key)
    cos: torch.Tensor    # [T_r, 1, 1, R] activation dtype, times mscale
    sin: torch.Tensor    # [T_r, 1, 1, R]

    def rotate(self, t: torch.Tensor, rotary_interleaved: bool) -> torch.Tensor:
        """``t`` [T_r, 1, H, D] (q or k as ``get_query_key_value_tensors`` gives them on the
        THD path) with RoPE applied to its first R channels."""
        rot_dim = self.cos.shape[-1]
        t_rot, t_pass = t[..., :rot_dim], t[..., rot_dim:]
        t_rot = (t_rot * self.cos) + (rotate_half(t_rot, rotary_interleaved) * self.sin)
        if t_pass.size(-1) == 0:  # all channels rotate: megatron-core's cat would only copy
            return t_rot
        return torch.cat((t_rot, t_pass), dim=-1)


def is_exact_mapping(freqs: torch.Tensor, total_padded_tokens: int) -> bool:
    """megatron-core's test for a table with one row per token of the pack (its case 1)."""
    return freqs.dim() >= 1 and freqs.size(0) == total_padded_tokens


def build_packed_rope_table(freqs: torch.Tensor, cu_seqlens_padded: torch.Tensor, cp_size: int,
                            cp_rank: int, mscale: float, dtype: torch.dtype) -> PackedRopeTable:
    """The table of one micro-batch (host boundaries; ``freqs`` [S, 1, 1, R] float32 on the
    device). Gathers the rows first and takes cos/sin of the packed rows, as megatron-core
    does, so that the elementwise kernels see the same tensor shape."""
    exact = is_exact_mapping(freqs, int(cu_seqlens_padded[-1]))
    positions = rope_positions(cu_seqlens_padded, cp_size, cp_rank, exact)
    rows = freqs.index_select(0, host_to_device(positions, freqs.device))
    cos = (torch.cos(rows) * mscale).to(dtype)
    sin = (torch.sin(rows) * mscale).to(dtype)
    return PackedRopeTable(freqs=freqs, cos=cos, sin=sin)


def packed_rope_table(params, freqs: torch.Tensor, cp_size: int, cp_rank: int, mscale: float,
                      dtype: torch.dtype) -> PackedRopeTable:
    """The table of ``params``' micro-batch for one CP place, frequency table and dtype:
    built on first use, then reused by every layer (the micro-batch cache)."""
    host = host_boundaries(params)
    key = (_ROPE_TABLE, id(freqs), cp_size, cp_rank, mscale, dtype)
    return host.cache.get(key, lambda: build_packed_rope_table(
        freqs, host.cu_seqlens_padded, cp_size, cp_rank, mscale, dtype))
