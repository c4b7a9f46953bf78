"""The sequence-level balancing loss on a pack == the loss of each sequence computed alone.

Reference: Switch Transformer's load-balancing loss written out for ONE sequence of T real
tokens, in float64 loops over tokens and experts (independent of the vectorised code):
``coeff * E * sum_i (count_i / (k T)) * (sum_t score_ti / T)``. The code under test sees the
sequences packed (padding after each, a pad-only filler at the end) and, for CP, split in the
zigzag layout over ranks, each rank adding its part; the parts must add up to the reference.
"""

import pytest
import torch

from megatron.varlen.model.moe_balancing import (
    micro_batch_balancing_part, per_sequence_sums, sequence_balancing_parts, switch_parts,
    z_loss_sum,
)
from megatron.varlen.model.moe_sequences import PADDING, SequenceMap, _thd_host_map
from megatron.varlen.packing.cp_split import get_thd_partition_indices

EXPERTS, TOPK, COEFF = 4, 2, 0.1
REAL = [5, 3, 7, 0]        # the last one is a pad-only filler (routed length 0)
PADDED = [8, 4, 8, 4]      # multiples of 2 * CP for CP = 2


def _pack(seed=0):
    """Scores and top-k map of every row of the packed stream (padding rows are garbage)."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(sum(PADDED), EXPERTS, generator=generator, dtype=torch.float64)
    scores = torch.softmax(logits, dim=-1)
    top = torch.topk(scores, TOPK, dim=-1).indices
    routing = torch.zeros_like(scores, dtype=torch.bool).scatter(1, top, True)
    return scores, routing


def _reference_loss(scores, routing, start, length):
    """One sequence alone, float64, loops."""
    total = 0.0
    for expert in range(EXPERTS):
        count = sum(bool(routing[start + t, expert]) for t in range(length))
        prob = sum(float(scores[start + t, expert]) for t in range(length))
        total += (count / (TOPK * length)) * (prob / length)
    return COEFF * EXPERTS * total


def _starts():
    return [sum(PADDED[:i]) for i in range(len(PADDED))]


def _references(scores, routing):
    return [_reference_loss(scores, routing, start, length) if length else 0.0
            for start, length in zip(_starts(), REAL)]


def _cu(values):
    return torch.tensor([0] + values).cumsum(0)


def test_pack_on_one_rank_equals_each_sequence_alone():
    scores, routing = _pack()
    rows = _thd_host_map(_cu(PADDED), torch.tensor(REAL), 1, 0)
    seq_map = SequenceMap(rows, torch.tensor(REAL, dtype=torch.float64), (), True)
    parts = sequence_balancing_parts(scores, routing, seq_map, TOPK, COEFF)
    assert parts.tolist() == pytest.approx(_references(scores, routing), rel=1e-12, abs=0)


@pytest.mark.parametrize("cp_size", [2, 4])
def test_cp_rank_parts_add_up_to_each_sequence_alone(cp_size):
    padded = [p * cp_size // 2 for p in PADDED]  # multiples of 2 * cp_size
    scores, routing = _pack_for(padded)
    cu = _cu(padded)
    lengths = torch.tensor(REAL)
    shards = []
    for rank in range(cp_size):
        rows = _thd_host_map(cu, lengths, cp_size, rank)
        local = get_thd_partition_indices(cu, cp_size, rank)
        shards.append((rows, scores[local], routing[local]))
    counts = sum(per_sequence_sums(r.double(), rows, len(REAL)) for rows, _, r in shards)
    parts = sum(switch_parts(per_sequence_sums(s, rows, len(REAL)), counts,
                             lengths.double(), TOPK, COEFF) for rows, s, _ in shards)
    starts = [sum(padded[:i]) for i in range(len(padded))]
    expected = [_reference_loss(scores, routing, start, n) if n else 0.0
                for start, n in zip(starts, REAL)]
    assert parts.tolist() == pytest.approx(expected, rel=1e-12, abs=0)


def _pack_for(padded):
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(sum(padded), EXPERTS, generator=generator, dtype=torch.float64)
    scores = torch.softmax(logits, dim=-1)
    top = torch.topk(scores, TOPK, dim=-1).indices
    return scores, torch.zeros_like(scores, dtype=torch.bool).scatter(1, top, True)


def test_padding_and_fillers_count_nowhere():
    rows = _thd_host_map(_cu(PADDED), torch.tensor(REAL), 1, 0)
    expected = []
    for index, (real, padded) in enumerate(zip(REAL, PADDED)):
        expected += [index] * real + [PADDING] * (padded - real)
    assert rows.tolist() == expected


def test_micro_batch_loss_is_not_the_mean_of_sequence_losses():
    """aux_loss (micro-batch domain) and seq_aux_loss differ on a pack: the test above would
    catch a seq_aux_loss computed over the whole micro-batch."""
    scores, routing = _pack()
    rows = _thd_host_map(_cu(PADDED), torch.tensor(REAL), 1, 0)
    seq_map = SequenceMap(rows, torch.tensor(REAL, dtype=torch.float64), (), True)
    whole = micro_batch_balancing_part(scores, routing, seq_map, TOPK, COEFF).item()
    lengths = [n for n in REAL if n]
    refs = [r for r, n in zip(_references(scores, routing), REAL) if n]
    weighted = sum(r * n for r, n in zip(refs, lengths)) / sum(lengths)
    assert whole != pytest.approx(weighted, rel=1e-3)
    flat = [i for i, n in zip(_starts(), REAL) for i in range(i, i + n)]
    alone = _reference_loss(scores[flat], routing[flat], 0, len(flat))
    assert whole == pytest.approx(alone, rel=1e-12)


def test_z_loss_sums_real_tokens_only():
    logits = torch.randn(sum(PADDED), EXPERTS, dtype=torch.float64)
    rows = _thd_host_map(_cu(PADDED), torch.tensor(REAL), 1, 0)
    seq_map = SequenceMap(rows, torch.tensor(REAL, dtype=torch.float64), (), True)
    expected = sum(float(torch.logsumexp(logits[t], dim=0)) ** 2
                   for t in range(len(rows)) if rows[t] >= 0)
    assert z_loss_sum(logits, seq_map).item() == pytest.approx(expected, rel=1e-12)


def test_the_map_builds_its_masks_once_for_every_layer():
    # What the MoE layers derive from a micro-batch's map (which rows are real, their sum
    # slots) is made once and shared, not remade in every layer (one kernel each on CUDA).
    from megatron.varlen.platform.host_syncs import count_dispatches

    scores, routing = _pack(seed=4)
    rows = _thd_host_map(torch.tensor([0, *torch.tensor(PADDED).cumsum(0).tolist()]),
                         torch.tensor(REAL), 1, 0)
    seq_map = SequenceMap(seq_index=rows, real_lengths=torch.tensor(REAL, dtype=torch.float32),
                          groups=(), counts_once=True)

    def layer():
        micro_batch_balancing_part(scores, routing, seq_map, TOPK, COEFF)
        z_loss_sum(scores, seq_map)
        seq_map.padding
        return sequence_balancing_parts(scores, routing, seq_map, TOPK, COEFF)

    first = layer()
    with count_dispatches() as counts:  # "the next layers": nothing rebuilt
        for _layer in range(3):
            again = layer()
    rebuilt = sorted((op, site) for op, site in counts if "moe_sequences.py" in site)
    assert rebuilt == [], rebuilt
    assert torch.equal(again, first)
    assert torch.equal(seq_map.valid, rows >= 0) and torch.equal(seq_map.padding, rows < 0)
