"""A packed micro-batch records which rows hold real tokens ONCE (its routed lengths); its
``padding_mask`` and the MoE sequence map's padding rows are both derived from that record and
must agree on every rank's share.

Reference for the mask: a loop over the pack's sequences marking the first ``real`` rows of
each non-filler sequence, written here. Packs: random real lengths, padded for CP 1, 2 and 4,
with a pad-only filler tail (``append_dummy_seq``) or more padding of the last sequence
(``extend_last``).
"""

import gc
import random

import pytest
import torch

from megatron.varlen.model import moe_sequences
from megatron.varlen.model.moe_sequences import thd_sequence_map, unpacked_micro_batch_cache
from megatron.varlen.packing.thd_microbatch import build_model_inputs, pack_sequences
from megatron.varlen.packing.thd_shapes import APPEND_DUMMY_SEQ, EXTEND_LAST

PAD = 0


class _Group:
    """A CP group stand-in: its size and this rank (the map reads nothing else)."""

    def __init__(self, size: int, rank: int):
        self._size, self._rank = size, rank

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank


def _pack(rng: random.Random, cp: int, policy: str):
    unit = 2 * cp
    real = [rng.randint(1, 20) for _ in range(rng.randint(1, 6))]
    padded = [-(-length // unit) * unit + unit * rng.randint(0, 1) for length in real]
    sequences = [{"tokens": torch.arange(1, length + 1), "labels": torch.arange(length),
                  "loss_mask": torch.ones(length)} for length in real]
    total = sum(padded) + unit * rng.randint(1, 3)  # room for a filler tail
    pack = pack_sequences(sequences, padded, local_cp_size=cp, pad_id=PAD,
                          sample_ids=tuple(range(len(real))), total_tokens=total,
                          tail_policy=policy)
    return pack, real, padded


def _reference_mask(real: list[int], padded: list[int], total: int) -> torch.Tensor:
    mask = torch.ones(total, dtype=torch.bool)
    start = 0
    for length, slots in zip(real, padded):  # the filler tail, if any, stays True
        mask[start:start + length] = False
        start += slots
    return mask


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("cp", [1, 2, 4])
@pytest.mark.parametrize("policy", [APPEND_DUMMY_SEQ, EXTEND_LAST])
def test_padding_mask_and_sequence_map_agree(seed, cp, policy):
    pack, real, padded = _pack(random.Random(seed), cp, policy)
    assert torch.equal(pack.padding_mask, _reference_mask(real, padded, pack.tokens.numel()))
    for rank in range(cp):
        group = _Group(cp, rank)
        inputs = build_model_inputs(pack, rank, group if cp > 1 else None, "cpu")
        seq_map = thd_sequence_map(inputs["packed_seq_params"], group, None, False,
                                   torch.device("cpu"))
        assert torch.equal(seq_map.padding, inputs["padding_mask"][0]), (seed, cp, rank)


def test_an_unpacked_micro_batchs_cache_lives_as_long_as_its_padding_mask():
    """The module-level table of unpacked micro-batches' caches is keyed by the mask object
    every layer of one forward receives, weakly: one cache per mask (not per equal values),
    and the entry goes with its mask (no growth over a run, no map of a dead micro-batch
    found again under a reused id)."""
    def entries() -> int:
        gc.collect()
        return len(moe_sequences._UNPACKED_CACHES)

    before = entries()
    mask = torch.zeros(2, 8, dtype=torch.bool)
    cache = unpacked_micro_batch_cache(mask)
    assert unpacked_micro_batch_cache(mask) is cache  # every layer of the forward
    assert unpacked_micro_batch_cache(mask.clone()) is not cache  # the next micro-batch
    assert unpacked_micro_batch_cache(None) is None
    assert entries() == before + 1  # the clone's entry went with the clone
    del mask
    assert entries() == before
