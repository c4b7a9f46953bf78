"""The user's global batch -> checked data-path samples, identical on every rank.

Two ways to hand over a batch (config key ``wrap.batch_source`` or ``train(..., source=)``):

- ``"all_ranks"`` (default): every rank passes the same global batch and converts it itself.
  No communication; conversion (tokenization) is repeated on every rank.
- ``"rank0"``: only global rank 0 passes the batch (other ranks pass anything, e.g. None).
  Rank 0 converts and checks it, then one ``broadcast_object_list`` over the world sends the
  converted samples, or the error, to every rank: a pickled copy of the whole batch travels to
  each of the ``world - 1`` other ranks (about 8 bytes per token per int64 field) every step.
  Use it when only one process produces the data (e.g. a rollout server).

With ``"all_ranks"`` on more than one rank, the ranks compare a fingerprint of their converted
batch (sample count, lengths and a BLAKE2b hash of every field the flow packs: tokens, labels,
loss mask and the flow's extra fields such as per-token advantages; one small
``all_gather_object`` per step) and all raise the same one-line ValueError naming the
ranks that disagree with rank 0, instead of training each replica on another batch.

Either way every rank ends up with the whole global batch (each DP replica then takes its own
block, and the flow's extra fields are packed from it), and every check runs before the first
collective of the step, so a bad sample raises the same one-line ValueError on every rank.
A bug in the flow's code on one rank (any exception but a BatchError, a plain ValueError too)
keeps its traceback there; the other ranks stop in one line naming it
(``errors.PeerRankError``), never waiting for it.
"""

from __future__ import annotations

import functools
import hashlib
import struct
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from megatron.varlen_training.config import RunConfig
from megatron.varlen_training.errors import agree_and_gather, peer_rank_error
from megatron.varlen_training.log import is_multi_rank
from megatron.wrap.config.keys import BATCH_SOURCES
from megatron.wrap.flows import fields
from megatron.wrap.flows.fields import BatchError

SEQ_LENGTH_KEY = "seq_length"
_HASHED_FIELDS = ("tokens", "labels", "loss_mask")
_DIGEST_BYTES = 8  # a 64-bit content hash: an accidental match is not a concern
_OK, _USER_ERROR, _CRASH = "ok", "user error", "crash"  # rank 0's batch, as broadcast


def length_limit(run: RunConfig) -> tuple[int, str]:
    """Longest real sample length this run can take, and the config key that sets it.

    That is ``--seq-length``: argument validation already guarantees that a sample of that
    length, padded for the largest CP group it may get, fits the per-rank token budget.
    """
    return run.model.seq_length, SEQ_LENGTH_KEY


def check_batch(batch: Any, what: str) -> None:
    """A non-empty list of samples, or a one-line ValueError."""
    if batch is None or (isinstance(batch, Sequence) and not isinstance(batch, (str, bytes))
                         and len(batch) == 0):
        raise BatchError(f"empty batch: {what}() needs a non-empty list of samples (got "
                         f"{'None' if batch is None else 0})")
    if not isinstance(batch, (list, tuple)):
        raise BatchError(f"{what}() takes a list of samples (dicts), got {type(batch).__name__}")


def check_lengths(samples: list[dict], limit: int, key: str) -> None:
    """Every sample fits the run (see :func:`length_limit`), or a one-line ValueError."""
    for index, sample in enumerate(samples):
        if sample["length"] > limit:
            raise fields.sample_error(
                index, "tokens", f"length {sample['length']} exceeds the limit {limit} of this "
                                 f"run (config key {key!r}); shorten the sample or raise {key}")


def _convert(batch, flow, what: str) -> list[dict]:
    check_batch(batch, what)
    samples = flow.build_samples(batch)
    check_lengths(samples, flow.context.max_length, flow.context.max_length_key)
    return samples


def global_batch(batch, flow, source: str, what: str = "train") -> list[dict]:
    """The checked data-path samples of the global batch, on every rank (module docstring).

    Raises:
        BatchError: Bad ``source``, or a bad batch/sample (the same message on every rank).
    """
    if source not in BATCH_SOURCES:
        raise BatchError(f"batch source {source!r} (config key 'wrap.batch_source'): choose "
                         f"from {', '.join(BATCH_SOURCES)}")
    if not is_multi_rank():
        return _convert(batch, flow, what)
    if source == "all_ranks":
        return _agreed_batch(batch, flow, what)
    payload = [None]
    error = None
    if dist.get_rank() == 0:
        try:
            payload = [(_OK, _convert(batch, flow, what))]
        except BatchError as err:
            payload = [(_USER_ERROR, str(err))]
        except Exception as err:  # other ranks must not wait forever for a crashed rank 0
            payload, error = [(_CRASH, (type(err).__name__, str(err)))], err
    dist.broadcast_object_list(payload, src=0)
    status, value = payload[0]
    if error is not None:
        raise error
    if status == _USER_ERROR:
        raise BatchError(value)
    if status == _CRASH:
        raise peer_rank_error(0, *value)
    return value


def fingerprint(samples: list[dict], fields: Sequence[str] = _HASHED_FIELDS
                ) -> tuple[int, int, str]:
    """``(count, total length, hash of lengths and contents)`` of converted samples: of
    ``fields`` (per-token tensors, or one number per sample)."""
    digest = hashlib.blake2b(digest_size=_DIGEST_BYTES)
    for sample in samples:
        digest.update(int(sample["length"]).to_bytes(8, "little"))
        for field in fields:
            value = sample[field]
            if isinstance(value, torch.Tensor):
                digest.update(value.detach().cpu().contiguous().numpy().tobytes())
            else:  # a per-sample field's number
                digest.update(struct.pack("<d", float(value)))
    return len(samples), sum(int(s["length"]) for s in samples), digest.hexdigest()


def packed_fields(flow) -> tuple[str, ...]:
    """Every field of the flow's samples that is packed for the model or the loss: a rank
    whose copy differs in any of them (say, per-token advantages) trains on another batch."""
    return (*_HASHED_FIELDS, *sorted(flow.extra_fields()))


def _agreed_batch(batch, flow, what: str) -> list[dict]:
    """Converts this rank's copy of the batch; every rank raises if any rank's copy was bad
    (errors.agree_and_gather: the first bad copy's error; a bug in the flow keeps its traceback
    on its rank) or differs from rank 0's (module docstring)."""
    # Only BatchError is the user's input: a plain ValueError comes from the flow's code.
    # The fields are asked of the flow inside the exchange: a bug there must not hang a peer.
    samples, prints = agree_and_gather(functools.partial(_convert, batch, flow, what),
                                       lambda samples: fingerprint(samples, packed_fields(flow)),
                                       plain_user_errors=())
    differ = [rank for rank, value in enumerate(prints) if value != prints[0]]
    if differ:
        def describe(rank):
            count, tokens, _ = prints[rank]
            return f"rank {rank}: {count} samples, {tokens} tokens"
        raise BatchError(
            f"{what}(): the batch differs across ranks with batch_source 'all_ranks' (ranks "
            f"{differ} differ from rank 0 in the samples' count, lengths or fields "
            f"{', '.join(packed_fields(flow))}; {describe(0)}; {describe(differ[0])}): pass the "
            f"same global batch on every rank, or use batch_source 'rank0' (config key "
            f"'wrap.batch_source')")
    return samples
