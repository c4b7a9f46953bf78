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
# Per-token fields the packer rebuilds for the layout the schedule chose (never sent).
REBUILT_FIELDS = ("position_ids",)
EXTRA_FIELDS_HINT = "PackingConfig.extra_token_fields"


def is_per_token(value) -> bool:
    """Whether a sample's value holds one entry per token (a tensor with a sequence dim); plain
    numbers and 0-d tensors are per-sample values, which the caller keeps (by sample id)."""
    return isinstance(value, torch.Tensor) and value.dim() >= 1


def check_sample_fields(samples: Mapping[int, dict], extra_token_fields: Sequence[str]) -> None:
    """Refuses a per-token field the packing path would silently drop, and a declared one a
    sample lacks.

    Raises:
        ValueError: one line naming the sample, the field and the declaration to change.
    """
    known = (*_INT_FIELDS, *_FLOAT_FIELDS, *REBUILT_FIELDS, *extra_token_fields)
    for sid, sample in samples.items():
        for key, value in sample.items():
            if key not in known and is_per_token(value):
                raise ValueError(
                    f"sample {sid} has per-token field {key!r}, which the packing path does not "
                    f"carry (it carries {', '.join(known)}): declare it in {EXTRA_FIELDS_HINT} "
                    "to carry it like loss_mask, or remove it from the samples")
        missing = [key for key in extra_token_fields if key not in sample]
        if missing:
            raise ValueError(f"sample {sid} lacks the declared per-token field(s) {missing} "
                             f"({EXTRA_FIELDS_HINT}): add them to every sample or undeclare them")


def assigned_ids(microbatches, rank: int) -> list[int]:
    """Ids rank ``rank`` runs, in micro-batch order: the order of every transfer list."""
    return [sid for microbatch in microbatches for sid in microbatch[rank]]


def lane_rank(replica: int, receiver: int, cp_size: int) -> int:
    """The DP x CP rank of DP replica ``replica`` in ``receiver``'s CP lane."""
    return replica * cp_size + receiver % cp_size


def sender_of(sample_id: int, receiver: int, owners: Sequence[int], cp_size: int) -> int:
    """The DP x CP rank that sends ``sample_id`` to ``receiver`` (same CP lane, owning replica)."""
    return lane_rank(owners[sample_id], receiver, cp_size)


def transfer_lists(microbatches, owners, cp_size, num_ranks, me):
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


def _real_entries(value: torch.Tensor, size: int) -> torch.Tensor:
    """The first ``size`` entries of a per-token ``value``, flat. A 1-D value of exactly that
    size is returned as it is: this runs for every sample and field of a step, and a reshape or
    slice that changes nothing still costs an operator call on the host."""
    flat = value if value.dim() == 1 else value.reshape(-1)
    return flat if flat.numel() == size else flat[:size]


def _payload(samples: Mapping[int, dict], ids: list[int], fields, sizes, dtype) -> torch.Tensor:
    parts = [_real_entries(samples[sid][field], sizes[sid]).to(dtype)
             for sid in ids for field in fields]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=dtype)


def exchange(send_lists, recv_lists, samples, sizes, fields, dtype, group, device):
    """One ``all_to_all_single`` over ``group``: the first ``sizes[id]`` entries of each field
    of every sample in ``send_lists[rank]`` go to ``rank``; returns the received buffer (on
    ``device``) in ``recv_lists`` order, field after field within a sample."""
    width = len(fields)
    send_sizes = [width * sum(sizes[s] for s in ids) for ids in send_lists]
    recv_sizes = [width * sum(sizes[s] for s in ids) for ids in recv_lists]
    send_buf = torch.cat([_payload(samples, ids, fields, sizes, dtype) for ids in send_lists])
    recv_buf = torch.empty(sum(recv_sizes), dtype=dtype, device=device)
    dist.all_to_all_single(recv_buf, send_buf.to(device), recv_sizes, send_sizes, group=group)
    return recv_buf


def unpack(buffer: torch.Tensor, recv_lists, sizes, fields, into: dict) -> None:
    """Splits an :func:`exchange` buffer into ``into[id][field]``: disjoint views of
    ``buffer``, which the exchange allocated for this step alone. One ``split`` for all the
    samples, so the step's operator calls here do not grow with its sequences (a slice and a
    copy per sample and field did)."""
    order = [(sid, field) for ids in recv_lists for sid in ids for field in fields]
    pieces = buffer.split([sizes[sid] for sid, _ in order]) if order else ()
    for (sid, field), piece in zip(order, pieces, strict=True):
        into.setdefault(sid, {})[field] = piece


def reroute_samples(local_samples: Mapping[int, dict], microbatches, owners: Sequence[int],
                    lengths: Sequence[int], cp_size: int, group, device,
                    extra_token_fields: Sequence[str] = ()) -> dict[int, dict]:
    """Returns {sample id: {"tokens", "labels", "loss_mask", *extra_token_fields}} (real
    tokens) for this rank.

    Args:
        local_samples: the samples this rank's DP replica loaded, by global id (not modified;
            checked by :func:`check_sample_fields` first).
        microbatches: ``schedule.microbatches`` ([mb][rank] -> ids), identical on every rank.
        owners: owning DP replica of each global id.
        lengths: real length of each global id.
        cp_size: static CP size (ranks per DP replica in the DP x CP group).
        group: the DP x CP process group (rank index = dp_rank * cp + cp_rank).
        extra_token_fields: further per-token fields the caller declared (sent as float32,
            with ``loss_mask``).
    """
    check_sample_fields(local_samples, extra_token_fields)
    num_ranks = dist.get_world_size(group)
    me = dist.get_rank(group)
    send, recv = transfer_lists(microbatches, owners, cp_size, num_ranks, me)
    received: dict[int, dict] = {}
    float_fields = (*_FLOAT_FIELDS, *extra_token_fields)
    for fields, dtype in ((_INT_FIELDS, torch.int64), (float_fields, torch.float32)):
        buffer = exchange(send, recv, local_samples, lengths, fields, dtype, group, device)
        unpack(buffer.cpu(), recv, lengths, fields, received)
    return received


# Megatron-LM's sub-sample fields (the seed API's rerouting): one entry per token ...
SUBSAMPLE_TOKEN_FIELDS = ("tokens", "labels", "loss_mask", "position_ids")
# ... or one value per sub-sample.
SUBSAMPLE_SCALAR_FIELDS = ("original_seq_len", "padded_seq_len")
SEED_EXTRA_FIELDS_HINT = "the config's extra_token_fields"


def subsample_fields(batch: Sequence[dict],
                     extra_token_fields: Sequence[str]) -> tuple[list[str], list[str]]:
    """(per-token fields, per-sample fields) of the sub-samples ``batch``, in a fixed order.

    Raises:
        ValueError: one line, for a field the rerouting does not know (it would be lost) or a
            sub-sample whose fields differ from sub-sample 0's.
    """
    if not batch:
        raise ValueError("this DP replica holds no sub-sample: every replica needs at least one "
                         "per global batch (the fields to exchange are read from it)")
    token_fields = (*SUBSAMPLE_TOKEN_FIELDS, *extra_token_fields)
    keys = set(batch[0])
    unknown = sorted(keys - set(token_fields) - set(SUBSAMPLE_SCALAR_FIELDS))
    if unknown:
        raise ValueError(
            f"cannot reroute unsupported sample keys {unknown} (known: "
            f"{', '.join((*token_fields, *SUBSAMPLE_SCALAR_FIELDS))}): declare per-token fields "
            f"in {SEED_EXTRA_FIELDS_HINT}, or remove them from the samples")
    for index, sample in enumerate(batch[1:], start=1):
        if set(sample) != keys:
            raise ValueError(f"sample {index} keys {sorted(sample)} do not match sample 0 keys "
                             f"{sorted(keys)}: give every sub-sample the same fields")
    return ([key for key in token_fields if key in keys],
            [key for key in SUBSAMPLE_SCALAR_FIELDS if key in keys])


def reroute_subsamples(local: Mapping[int, dict], sample_id_groups, owners: Mapping[int, int],
                       lengths: Mapping[int, int], cp_size: int, group, device,
                       extra_token_fields: Sequence[str] = ()) -> dict[int, dict]:
    """{global id: {field: tensor}} of the sub-samples this rank runs, in id order, every field
    with its own dtype, on ``device`` (the seed API's rerouting; same transfer plan as
    :func:`reroute_samples`, one ``all_to_all_single`` per field).

    Args:
        local: this replica's sub-samples by global id (Megatron-LM's fields, not modified).
        sample_id_groups: [group][rank] -> ids, identical on every rank.
        owners: owning DP replica of each global id.
        lengths: real length of each global id.
    """
    token_fields, scalar_fields = subsample_fields(list(local.values()), extra_token_fields)
    me = dist.get_rank(group)
    send, recv = transfer_lists(sample_id_groups, owners, cp_size, dist.get_world_size(group), me)
    one_each = {sid: 1 for sid in lengths}
    sample0 = next(iter(local.values()))
    received: dict[int, dict] = {}
    for fields, sizes in ((token_fields, lengths), (scalar_fields, one_each)):
        for key in fields:
            buffer = exchange(send, recv, local, sizes, (key,), sample0[key].dtype, group, device)
            unpack(buffer, recv, sizes, (key,), received)
    return {sid: received[sid] for sid in sorted(received)}
