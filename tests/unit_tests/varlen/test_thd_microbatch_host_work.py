"""A pack's fields are laid out in a fixed number of operator calls, with the same values.

thd_microbatch.pack_sequences used to pad every field of every sequence on its own (a ``full``
and a copy per field and sequence) and concatenate; it now scatters all sequences' tokens at
once. Reference: that per-sequence padding, written out here as a loop (``_reference_pack``),
over random packs with fillers, extra fields and both tail policies: every field bitwise equal.
Then the operator counts of packing 4 or 64 sequences (the same tokens) are equal, and
build_model_inputs computes the CP split index once for all fields.
"""

import dataclasses
import random

import pytest
import torch

from megatron.varlen.packing.cp_split import split_thd_for_cp
from megatron.varlen.packing.thd_microbatch import (
    PAD_POSITION, build_model_inputs, dummy_pack, pack_sequences,
)
from megatron.varlen.packing.thd_shapes import APPEND_DUMMY_SEQ, EXTEND_LAST
from megatron.varlen.platform.host_syncs import count_dispatches

PAD_ID = 7
FIELDS = ("tokens", "labels", "loss_mask", "position_ids", "padding_mask")


def _padded(values, length, fill):
    out = torch.full((length,), fill, dtype=values.dtype)
    out[: values.numel()] = values
    return out


def _reference_fields(pack_input, padded_lengths, extra_fields):
    """Every field of the pack, sequence by sequence (fillers: all padding)."""
    parts = {key: [] for key in (*FIELDS, *extra_fields)}
    for seq, padded in zip(pack_input, padded_lengths):
        length, filler = seq["tokens"].numel(), seq.get("is_filler", False)
        parts["tokens"].append(_padded(seq["tokens"].long(), padded, PAD_ID))
        parts["labels"].append(_padded(seq["labels"].long(), padded, PAD_ID))
        parts["loss_mask"].append(_padded(seq["loss_mask"].float(), padded, 0.0))
        positions = torch.arange(0 if filler else length, dtype=torch.int64)
        parts["position_ids"].append(_padded(positions, padded, PAD_POSITION))
        parts["padding_mask"].append(_padded(torch.full((length,), filler), padded, True))
        for key in extra_fields:
            parts[key].append(_padded(seq[key].float(), padded, 0.0))
    return {key: torch.cat(values) for key, values in parts.items()}


def _sequences(rng, lengths, extra_fields=()):
    gen = torch.Generator().manual_seed(rng.randint(0, 10**6))
    return [{"tokens": torch.randint(0, 100, (n,), generator=gen),
             "labels": torch.randint(0, 100, (n,), generator=gen),
             "loss_mask": (torch.rand(n, generator=gen) > 0.3).float(),
             **{key: torch.rand(n, generator=gen) for key in extra_fields}} for n in lengths]


@pytest.mark.parametrize("seed", range(25))
def test_fields_equal_the_per_sequence_padding(seed):
    rng = random.Random(seed)
    lengths = [rng.randint(0, 9) for _ in range(rng.randint(1, 6))]
    padded = [n + rng.randint(0, 3) for n in lengths]
    padded = [max(p, 1) for p in padded]
    extra_fields = ("weights",) if rng.random() < 0.5 else ()
    sequences = _sequences(rng, lengths, extra_fields)
    total = sum(padded) + rng.choice([0, 0, 5])
    policy = rng.choice([APPEND_DUMMY_SEQ, EXTEND_LAST])
    pack = pack_sequences(sequences, padded, 1, PAD_ID, sample_ids=tuple(range(len(lengths))),
                          total_tokens=total, extra_fields=extra_fields, tail_policy=policy)
    # The reference sees what the pack was made of: the same sequences, tail included.
    if total > sum(padded) and policy == APPEND_DUMMY_SEQ:
        sequences = sequences + [{"tokens": torch.full((total - sum(padded),), PAD_ID),
                                  "labels": torch.full((total - sum(padded),), PAD_ID),
                                  "loss_mask": torch.zeros(total - sum(padded)),
                                  **{k: torch.zeros(total - sum(padded)) for k in extra_fields},
                                  "is_filler": True}]
        padded = padded + [total - sum(padded)]
    elif total > sum(padded):
        padded = padded[:-1] + [padded[-1] + total - sum(padded)]
    expected = _reference_fields(sequences, padded, extra_fields)
    got = {key: getattr(pack, key) for key in FIELDS} | pack.extra
    for key, value in expected.items():
        assert got[key].dtype == value.dtype and torch.equal(got[key], value), key


def test_a_dummy_pack_is_all_padding():
    pack = dummy_pack(PAD_ID, sp_factor=2, extra_fields=("weights",))
    assert torch.equal(pack.tokens, torch.full((4,), PAD_ID))
    assert pack.padding_mask.all() and not pack.loss_mask.any()
    assert torch.equal(pack.position_ids, torch.full((4,), PAD_POSITION))


def _pack_ops(num_sequences, tokens=512):
    sequences = _sequences(random.Random(0), [tokens // num_sequences] * num_sequences)
    with count_dispatches() as counts:
        pack_sequences(sequences, [tokens // num_sequences] * num_sequences, 1, PAD_ID)
    return sum(counts.values())


def test_packing_work_does_not_grow_with_the_sequences():
    assert _pack_ops(4) == _pack_ops(64)


def test_the_cp_split_index_is_made_once_for_all_fields():
    sequences = _sequences(random.Random(1), [8, 4, 12])
    pack = pack_sequences(sequences, [8, 4, 12], 2, PAD_ID, extra_fields=())
    whole = dataclasses.replace(pack, local_cp_size=1)  # the same pack, not split
    with count_dispatches() as counts:
        inputs = build_model_inputs(pack, 1, None, "cpu")
    with count_dispatches() as unsplit:
        build_model_inputs(whole, 0, None, "cpu")

    def repeats(table):
        return sum(n for (op, _), n in table.items() if op == "repeat_interleave")

    assert repeats(counts) == repeats(unsplit) + 1  # the split index, once for all fields
    for key in FIELDS:  # what splitting each field on its own gave
        assert torch.equal(inputs[key][0], split_thd_for_cp(
            getattr(pack, key), pack.cu_seqlens_padded, 2, 1, seq_dim=0)), key
