"""Context-parallel (CP) split of packed (THD) and plain (SBHD) batches, and its inverse.

The load-balanced causal split: every sequence's PADDED span is cut into ``2 * cp`` equal
chunks and CP rank ``r`` keeps chunks ``r`` and ``2*cp - 1 - r``, in that order. Pairing an early
chunk with a late one gives every rank the same amount of causal-attention work. The split is
done per sequence, never over the concatenated stream, and the chunk boundaries come from the
padded lengths, never from the real ones (splitting the stream or using real boundaries leaks
tokens across sequences: Megatron-LM issues 4494 and 5191). This is the plain-torch twin of
Transformer Engine's ``thd_get_partitioned_indices``.

Shape legend:
    n   = sequences in the pack
    T   = tokens in the packed, padded stream (= cu_seqlens_padded[-1])
    T_r = tokens one CP rank keeps (= T / cp)
    S   = sequence length of a non-packed (sbhd) batch; S_r = S / cp
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

# Chunks per rank in the load-balanced split (one early, one mirrored late chunk).
CHUNKS_PER_RANK = 2


def _validate_split(cu_seqlens_padded: torch.Tensor, cp_size: int, cp_rank: int) -> torch.Tensor:
    """Checks the arguments of a CP split and returns the padded lengths [n]."""
    if cp_size < 1:
        raise ValueError(f"cp_size must be >= 1, got {cp_size}")
    if not 0 <= cp_rank < cp_size:
        raise ValueError(f"cp_rank must be in [0, {cp_size}), got {cp_rank}")
    if cu_seqlens_padded.dim() != 1 or cu_seqlens_padded.numel() < 1:
        raise ValueError(
            f"cu_seqlens_padded must be 1-D with n+1 entries, got shape "
            f"{tuple(cu_seqlens_padded.shape)}"
        )
    lengths = (cu_seqlens_padded[1:] - cu_seqlens_padded[:-1]).long()
    if bool((lengths < 0).any()):
        raise ValueError(f"cu_seqlens_padded must be non-decreasing, got {cu_seqlens_padded}")
    divisor = CHUNKS_PER_RANK * cp_size
    if cp_size > 1:
        bad = torch.nonzero(lengths % divisor).flatten()
        if bad.numel() > 0:
            index = int(bad[0])
            raise ValueError(
                f"sequence {index} has padded length {int(lengths[index])}, which is not "
                f"divisible by 2*cp_size = {divisor}; pad every sequence to a multiple of "
                f"{divisor} and pass the padded boundaries (cu_seqlens_padded)"
            )
    return lengths


def concat_ranges(starts: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``cat([arange(s, s + l) for s, l in zip(starts, lengths)])`` without a Python loop.

    One ``repeat_interleave`` given its output size: row j of range i is ``j + (starts[i] -
    where range i begins in the output)``.
    """
    total = int(lengths.sum())
    if total == 0:
        return torch.zeros(0, dtype=torch.long, device=starts.device)
    shift = starts - (torch.cumsum(lengths, 0) - lengths)
    return torch.arange(total, device=starts.device) + torch.repeat_interleave(
        shift, lengths, output_size=total)


def get_thd_partition_indices(
    cu_seqlens_padded: torch.Tensor, cp_size: int, cp_rank: int
) -> torch.Tensor:
    """Indices into the packed padded stream of the tokens CP rank ``cp_rank`` keeps.

    Args:
        cu_seqlens_padded: [n+1] cumulative PADDED sequence lengths of the whole (unsplit) pack.
        cp_size: size of the CP group.
        cp_rank: this rank's index in the CP group.

    Returns:
        LongTensor [T_r]: sequence by sequence, the indices of chunk ``cp_rank`` then chunk
        ``2*cp_size - 1 - cp_rank`` of that sequence. With ``cp_size == 1`` every index, in order
        (no divisibility requirement).

    Raises:
        ValueError: a padded length is not divisible by ``2 * cp_size`` (the message names the
            sequence index, its length and the divisor), or the arguments are malformed.
    """
    lengths = _validate_split(cu_seqlens_padded, cp_size, cp_rank)
    if cp_size == 1:  # every sequence whole, in order: the boundaries' span (no index work)
        return torch.arange(int(cu_seqlens_padded[0]), int(cu_seqlens_padded[-1]),
                            dtype=torch.long, device=cu_seqlens_padded.device)
    starts = cu_seqlens_padded[:-1].long()
    chunk = lengths // (CHUNKS_PER_RANK * cp_size)
    front = starts + cp_rank * chunk
    back = starts + (CHUNKS_PER_RANK * cp_size - 1 - cp_rank) * chunk
    range_starts = torch.stack([front, back], dim=1).flatten()  # [2n]: front0, back0, front1...
    range_lengths = torch.stack([chunk, chunk], dim=1).flatten()
    return concat_ranges(range_starts, range_lengths)


def get_thd_restore_order(cu_seqlens_padded: torch.Tensor, cp_size: int) -> torch.Tensor:
    """Permutation that turns the rank-ordered concatenation of all CP shards into the stream.

    ``full = torch.cat(shards)[order]`` where ``shards[r]`` is rank r's split (any leading
    sequence dim of size T_r).

    Returns:
        LongTensor [T].
    """
    return torch.argsort(get_thd_rank_order(cu_seqlens_padded, cp_size))


def get_thd_rank_order(cu_seqlens_padded: torch.Tensor, cp_size: int) -> torch.Tensor:
    """Stream positions of the rank-ordered concatenation of all CP shards (the inverse of
    :func:`get_thd_restore_order`): ``torch.cat(shards) == full.index_select(0, order)``.

    Returns:
        LongTensor [T].
    """
    return torch.cat([get_thd_partition_indices(cu_seqlens_padded, cp_size, r)
                      for r in range(cp_size)])


def _check_seq_dim(tensor: torch.Tensor, seq_dim: int, expected: int, what: str) -> None:
    if tensor.size(seq_dim) != expected:
        raise ValueError(
            f"{what}: tensor has {tensor.size(seq_dim)} tokens along dim {seq_dim}, expected "
            f"{expected}"
        )


def split_thd_for_cp(
    tensor: torch.Tensor,
    cu_seqlens_padded: torch.Tensor,
    cp_size: int,
    cp_rank: int,
    seq_dim: int,
) -> torch.Tensor:
    """This CP rank's part of a packed tensor (T along ``seq_dim`` becomes T_r)."""
    _check_seq_dim(tensor, seq_dim, int(cu_seqlens_padded[-1]), "split_thd_for_cp")
    index = get_thd_partition_indices(cu_seqlens_padded, cp_size, cp_rank)
    return tensor.index_select(seq_dim, index.to(tensor.device))


def split_sbhd_for_cp(
    tensor: torch.Tensor, cp_size: int, cp_rank: int, seq_dim: int
) -> torch.Tensor:
    """This CP rank's part of a non-packed tensor: the same rule over the whole sequence dim."""
    whole = torch.tensor([0, tensor.size(seq_dim)], dtype=torch.long)
    return split_thd_for_cp(tensor, whole, cp_size, cp_rank, seq_dim)


def restore_thd_from_cp_shards(
    shards: Sequence[torch.Tensor], cu_seqlens_padded: torch.Tensor, seq_dim: int
) -> torch.Tensor:
    """Inverse of :func:`split_thd_for_cp`: the full packed tensor from every rank's shard.

    Args:
        shards: the CP shards in CP-rank order.
        cu_seqlens_padded: [n+1] padded boundaries of the whole pack.
        seq_dim: the token dimension.
    """
    order = get_thd_restore_order(cu_seqlens_padded, len(shards))
    return torch.cat(list(shards), dim=seq_dim).index_select(seq_dim, order.to(shards[0].device))


def restore_sbhd_from_cp_shards(shards: Sequence[torch.Tensor], seq_dim: int) -> torch.Tensor:
    """Inverse of :func:`split_sbhd_for_cp`."""
    whole = torch.tensor([0, sum(s.size(seq_dim) for s in shards)], dtype=torch.long)
    return restore_thd_from_cp_shards(shards, whole, seq_dim)


def gather_thd_from_cp(
    tensor: torch.Tensor, cu_seqlens_padded: torch.Tensor, group: dist.ProcessGroup, seq_dim: int
) -> torch.Tensor:
    """All-gathers every rank's shard over the CP ``group`` and restores the full stream.

    Not differentiable (for per-token losses, logging and tests). A group of size 1 makes no
    collective call.
    """
    if group.size() == 1:
        return tensor
    tensor = tensor.contiguous()
    shards = [torch.empty_like(tensor) for _ in range(group.size())]
    dist.all_gather(shards, tensor, group=group)
    return restore_thd_from_cp_shards(shards, cu_seqlens_padded, seq_dim)
