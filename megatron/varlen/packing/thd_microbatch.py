"""One THD micro-batch: the pack of a rank's sequences, and its per-rank model inputs (CP split +
VarlenPackedSeqParams). Not to be confused with ``scheduling/packing.py``, the scheduler's bin
packer that decides which sequences share a micro-batch.

A *pack* concatenates whole sequences: each sequence contributes its real tokens followed by
padding up to the length the schedule gave it (a multiple of 2*c*tp_sp for its CP group size
c). Nothing in a sample is modified: every tensor here is new.

Shape legend (one micro-batch on one rank):
    n   = sequences in the pack
    T   = tokens of the whole pack, padded (= cu_seqlens_padded[-1])
    T_r = tokens this rank keeps after the CP split (= T / c)
Model inputs are [1, T_r] (batch dimension 1, as megatron-core's THD path expects), among them
``padding_mask`` (True on every slot that holds no real token: Megatron-LM's micro-batch field,
which megatron-core's MoE routing reads). Fixed shapes (a pack padded to a token count, fixed-size
``cu_seqlens``): :mod:`megatron.varlen.packing.thd_shapes`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from megatron.varlen.packing.cp_split import concat_ranges, get_thd_partition_indices
from megatron.varlen.packing.packed_seq import host_to_device, varlen_packed_seq_params
from megatron.varlen.packing.thd_shapes import APPEND_DUMMY_SEQ, EXTEND_LAST, pad_cu_seqlens

_TOKEN_KEYS = ("tokens", "labels", "loss_mask", "position_ids")
_PADDING_MASK = "padding_mask"
# Position id of every padding token and of every token of a filler sequence. Real tokens count
# 0..L-1; padding and fillers never index a position table beyond a real sequence's last
# position (a learned absolute table of --seq-length rows suffices), as in Megatron-LM.
PAD_POSITION = 0
# Marks the pad-only filler sequences this module makes (their tokens are all padding).
_FILLER = "is_filler"
# A rank with no sequence in a micro-batch still runs forward/backward (DDP and the pipeline
# need every rank to take part): it gets one pad-only sequence of this many tokens per
# sequence-parallel factor, with loss_mask 0.
DUMMY_SEQUENCE_TOKENS = 2


@dataclass(frozen=True)
class PackedMicroBatch:
    """A whole (not yet CP-split) THD pack, identical on every rank of its CP group."""

    tokens: torch.Tensor        # [T] int64
    labels: torch.Tensor        # [T] int64
    loss_mask: torch.Tensor     # [T] float32
    position_ids: torch.Tensor  # [T] int64, 0..L_i-1 per sequence, 0 on padding and fillers
    cu_seqlens: torch.Tensor         # [n+1] int32, real lengths
    cu_seqlens_padded: torch.Tensor  # [n+1] int32, padded lengths
    # [n] int64: real tokens of each sequence, 0 for pad-only fillers (which cu_seqlens counts
    # as attended tokens). The one record of which rows hold real tokens: MoE routing counts
    # them, and the padding mask is derived from it (:attr:`padding_mask`).
    routed_lengths: torch.Tensor
    max_seqlen: int             # longest PADDED sequence (RoPE tables are built to this)
    local_cp_size: int
    sample_ids: tuple[int, ...]
    real_tokens: int
    # Per-token fields the caller declared ([T] float32, padding and filler 0), laid out and
    # CP-split exactly like loss_mask.
    extra: dict = field(default_factory=dict)

    @property
    def padding_mask(self) -> torch.Tensor:
        """[T] bool, True on padding and fillers (no real token): every row but the first
        ``routed_lengths[i]`` of each sequence."""
        return _padding_mask(self.tokens.numel(), self.cu_seqlens_padded, self.routed_lengths)


def _cumulative(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0] + lengths, dtype=torch.int64).cumsum(0).to(torch.int32)


def _padding_mask(total: int, cu_seqlens_padded: torch.Tensor, routed: torch.Tensor
                  ) -> torch.Tensor:
    """[total] bool, True on every row that holds no real token (padding, fillers)."""
    out = torch.ones(total, dtype=torch.bool)
    # The first routed[i] rows of sequence i hold its real tokens (int32 starts: int64 rows).
    out[concat_ranges(cu_seqlens_padded[:-1], routed)] = False
    return out


class _PackLayout:
    """Where each sequence's real tokens sit in the padded stream: every field is laid out by one
    scatter of all sequences' tokens (a fixed number of operator calls, however many sequences
    the pack holds; padding rows keep the field's fill value)."""

    def __init__(self, padded_lengths: list[int], real: list[int], routed: list[int]):
        starts = torch.tensor([0, *padded_lengths[:-1]], dtype=torch.int64).cumsum(0)
        self.total = sum(padded_lengths)
        self.rows = concat_ranges(starts, torch.tensor(real, dtype=torch.int64))
        # Rows of real (non-filler) tokens and their positions within their sequence.
        routed_t = torch.tensor(routed, dtype=torch.int64)
        self.routed_rows = concat_ranges(starts, routed_t)
        self.within = self.routed_rows - torch.repeat_interleave(
            starts, routed_t, output_size=self.routed_rows.numel())

    def scatter(self, values: list[torch.Tensor], dtype: torch.dtype, fill) -> torch.Tensor:
        out = torch.full((self.total,), fill, dtype=dtype)
        out[self.rows] = torch.cat(values).to(dtype)
        return out

    def positions(self) -> torch.Tensor:
        """0..L-1 over each real sequence's tokens, :data:`PAD_POSITION` elsewhere."""
        out = torch.full((self.total,), PAD_POSITION, dtype=torch.int64)
        out[self.routed_rows] = self.within
        return out


def _filler(length: int, pad_id: int, extra_fields=()) -> dict:
    """A pad-only sequence that is attended like a real one (no fully masked rows) but has
    loss_mask 0 (and every extra field 0), so it changes no number."""
    return {"tokens": torch.full((length,), pad_id), "labels": torch.full((length,), pad_id),
            "loss_mask": torch.zeros(length), **{key: torch.zeros(length) for key in extra_fields},
            _FILLER: True}


def _pad_tail(sequences: list[dict], padded_lengths: list[int], total_tokens: int | None,
              pad_id: int, extra_fields: tuple[str, ...], tail_policy: str):
    """(sequences, padded lengths) filling the pack up to ``total_tokens``: a filler sequence
    (``append_dummy_seq``) or more padding of the last sequence (``extend_last``)."""
    used = sum(padded_lengths)
    assert total_tokens is None or total_tokens >= used, (
        f"pack of {used} tokens exceeds the fixed pack length {total_tokens}")
    if total_tokens is None or total_tokens == used:
        return sequences, padded_lengths
    if tail_policy == EXTEND_LAST:
        return sequences, [*padded_lengths[:-1], padded_lengths[-1] + total_tokens - used]
    assert tail_policy == APPEND_DUMMY_SEQ, f"unknown THD tail padding policy {tail_policy!r}"
    return ([*sequences, _filler(total_tokens - used, pad_id, extra_fields)],
            [*padded_lengths, total_tokens - used])


def pack_sequences(sequences: list[dict], padded_lengths: list[int], local_cp_size: int,
                   pad_id: int, sample_ids: tuple[int, ...] = (),
                   total_tokens: int | None = None,
                   extra_fields: tuple[str, ...] = (),
                   tail_policy: str = APPEND_DUMMY_SEQ) -> PackedMicroBatch:
    """Concatenates sequences (dicts with REAL ``tokens``/``labels``/``loss_mask`` of length L)
    each padded to its entry of ``padded_lengths``.

    ``total_tokens`` (optional) fixes the pack's length: a filler sequence is appended, or with
    ``tail_policy`` ``extend_last`` the last sequence gets the extra padding (fixed THD shapes,
    :mod:`~megatron.varlen.packing.thd_shapes`; fixed p2p shapes with VPP).
    ``extra_fields``: further per-token fields of each sequence, padded with 0 like loss_mask.
    """
    assert len(sequences) == len(padded_lengths) > 0, "a pack needs at least one sequence"
    sequences, padded_lengths = _pad_tail(sequences, list(padded_lengths), total_tokens, pad_id,
                                          extra_fields, tail_policy)
    real = [int(seq["tokens"].numel()) for seq in sequences]
    for length, padded in zip(real, padded_lengths):
        assert length <= padded, f"sequence of {length} tokens cannot be padded to {padded}"
    routed = [0 if seq.get(_FILLER) else length for seq, length in zip(sequences, real)]
    layout = _PackLayout(padded_lengths, real, routed)
    parts = {
        "tokens": layout.scatter([seq["tokens"] for seq in sequences], torch.int64, pad_id),
        "labels": layout.scatter([seq["labels"] for seq in sequences], torch.int64, pad_id),
        "loss_mask": layout.scatter([seq["loss_mask"] for seq in sequences], torch.float32, 0.0),
        "position_ids": layout.positions(),
    }
    extra = {key: layout.scatter([seq[key] for seq in sequences], torch.float32, 0.0)
             for key in extra_fields}
    filler_tokens = sum(padded_lengths[len(sample_ids):]) if sample_ids else 0
    return PackedMicroBatch(
        **parts,
        cu_seqlens=_cumulative(real),
        cu_seqlens_padded=_cumulative(list(padded_lengths)),
        max_seqlen=max(padded_lengths),
        local_cp_size=local_cp_size,
        sample_ids=tuple(sample_ids),
        real_tokens=sum(real) - filler_tokens,
        extra=extra,
        routed_lengths=torch.tensor(routed, dtype=torch.int64),
    )


def dummy_pack(pad_id: int, sp_factor: int, total_tokens: int | None = None,
               extra_fields: tuple[str, ...] = ()) -> PackedMicroBatch:
    """A pad-only pack for a rank the schedule left idle in a micro-batch (loss_mask 0)."""
    tokens = total_tokens or DUMMY_SEQUENCE_TOKENS * sp_factor
    pack = pack_sequences([_filler(tokens, pad_id, extra_fields)], [tokens], local_cp_size=1,
                          pad_id=pad_id, extra_fields=extra_fields)
    return PackedMicroBatch(**{**pack.__dict__, "real_tokens": 0})


def build_model_inputs(pack: PackedMicroBatch, cp_rank: int, cp_group, device,
                       cu_seqlens_entries: int | None = None) -> dict:
    """This rank's [1, T_r] slice of ``pack`` and the VarlenPackedSeqParams the model needs.

    ``cp_group`` is the process group of size ``pack.local_cp_size`` this rank shares the pack
    with (None when the size is 1: no CP collective at all for this micro-batch).
    ``cu_seqlens_entries`` (--thd-max-packed-sequences + 1) fixes the size of the device
    ``cu_seqlens`` (trailing zero-length sequences) and sets ``max_seqlen`` to the pack's
    length, as Megatron-LM does; the host copies our layers read keep one entry per sequence.
    """
    size = pack.local_cp_size
    device = torch.device(device)
    inputs = {}
    fields = {**{key: getattr(pack, key) for key in (*_TOKEN_KEYS, _PADDING_MASK)},
              **pack.extra}
    # This rank's rows, one index for every field (the rule of cp_split.split_thd_for_cp).
    index = get_thd_partition_indices(pack.cu_seqlens_padded, size, cp_rank) if size > 1 \
        else None
    for key, local in fields.items():
        if index is not None:
            local = local.index_select(0, index)
        # Pinned, asynchronous copies on CUDA: building a step's batches never waits for the GPU.
        inputs[key] = host_to_device(local.unsqueeze(0), device)
    cu_real = host_to_device(pad_cu_seqlens(pack.cu_seqlens, cu_seqlens_entries), device)
    cu_padded = host_to_device(pad_cu_seqlens(pack.cu_seqlens_padded, cu_seqlens_entries), device)
    max_seqlen = pack.max_seqlen if cu_seqlens_entries is None else int(pack.cu_seqlens_padded[-1])
    # With the host copies for the attention plan and RoPE: no layer reads boundaries back.
    inputs["packed_seq_params"] = varlen_packed_seq_params(
        cu_real, cu_padded, pack.cu_seqlens, pack.cu_seqlens_padded, max_seqlen, size,
        cp_group=cp_group if size > 1 else None, routed_lengths=pack.routed_lengths)
    inputs["sample_ids"] = pack.sample_ids  # bookkeeping for checks; the model ignores it
    return inputs
