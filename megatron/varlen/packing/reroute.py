"""Move each sample from the DP replica that loaded it to the DP x CP ranks scheduled to run it.

Every rank of DP replica ``d`` (all its CP ranks) holds replica d's samples. Rank ``r`` of the
DP x CP group receives sample ``s`` from the rank of the owning replica that sits in the same CP
lane (``owner(s) * cp + r % cp``), so senders share the load evenly. Only REAL tokens travel
(padding is rebuilt by the packer for the CP size the schedule chose). Every rank derives all
send and receive sizes from the schedule and the gathered lengths, so one ``all_to_all_single``
per dtype does the whole exchange, with no size handshake.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist

_INT_FIELDS = ("tokens", "labels")  # int64 payload, in this order, L values each
_FLOAT_FIELDS = ("loss_mask",)      # float32 payload


def assigned_ids(microbatches, rank: int) -> list[int]:
    """Ids rank ``rank`` runs, in micro-batch order: the order of every transfer list."""
    return [sid for microbatch in microbatches for sid in microbatch[rank]]


def sender_of(sample_id: int, receiver: int, owners: Sequence[int], cp_size: int) -> int:
    """The DP x CP rank that sends ``sample_id`` to ``receiver`` (same CP lane, owning replica)."""
    return owners[sample_id] * cp_size + receiver % cp_size


def _transfer_lists(microbatches, owners, cp_size, num_ranks, me):
    """(ids I send to each rank, ids I receive from each rank), both in assigned order."""
    send = [[] for _ in range(num_ranks)]
    recv = [[] for _ in range(num_ranks)]
    for receiver in range(num_ranks):
        for sid in assigned_ids(microbatches, receiver):
            sender = sender_of(sid, receiver, owners, cp_size)
            if sender == me:
                send[receiver].append(sid)
            if receiver == me:
                recv[sender].append(sid)
    return send, recv


def _payload(samples: Mapping[int, dict], ids: list[int], fields, dtype) -> torch.Tensor:
    parts = [samples[sid][field][: samples[sid]["length"]].to(dtype)
             for sid in ids for field in fields]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=dtype)


def _exchange(send_lists, recv_lists, samples, lengths, fields, dtype, group, device):
    width = len(fields)
    send_sizes = [width * sum(lengths[s] for s in ids) for ids in send_lists]
    recv_sizes = [width * sum(lengths[s] for s in ids) for ids in recv_lists]
    send_buf = torch.cat([_payload(samples, ids, fields, dtype) for ids in send_lists])
    recv_buf = torch.empty(sum(recv_sizes), dtype=dtype, device=device)
    dist.all_to_all_single(recv_buf, send_buf.to(device), recv_sizes, send_sizes, group=group)
    return recv_buf.cpu()


def _unpack(buffer: torch.Tensor, recv_lists, lengths, fields, into: dict) -> None:
    offset = 0
    for ids in recv_lists:
        for sid in ids:
            for field in fields:
                into.setdefault(sid, {})[field] = buffer[offset: offset + lengths[sid]].clone()
                offset += lengths[sid]


def reroute_samples(local_samples: Mapping[int, dict], microbatches, owners: Sequence[int],
                    lengths: Sequence[int], cp_size: int, group, device,
                    extra_token_fields: Sequence[str] = ()) -> dict[int, dict]:
    """Returns {sample id: {"tokens", "labels", "loss_mask", *extra_token_fields}} (real
    tokens) for this rank.

    Args:
        local_samples: the samples this rank's DP replica loaded, by global id (not modified).
        microbatches: ``schedule.microbatches`` ([mb][rank] -> ids), identical on every rank.
        owners: owning DP replica of each global id.
        lengths: real length of each global id.
        cp_size: static CP size (ranks per DP replica in the DP x CP group).
        group: the DP x CP process group (rank index = dp_rank * cp + cp_rank).
        extra_token_fields: further per-token fields the caller declared (sent as float32,
            with ``loss_mask``).
    """
    num_ranks = dist.get_world_size(group)
    me = dist.get_rank(group)
    send, recv = _transfer_lists(microbatches, owners, cp_size, num_ranks, me)
    received: dict[int, dict] = {}
    float_fields = (*_FLOAT_FIELDS, *extra_token_fields)
    for fields, dtype in ((_INT_FIELDS, torch.int64), (float_fields, torch.float32)):
        buffer = _exchange(send, recv, local_samples, lengths, fields, dtype, group, device)
        _unpack(buffer, recv, lengths, fields, received)
    return received
