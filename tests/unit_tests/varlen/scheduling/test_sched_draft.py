"""Prices (pricing.py) and drafts (draft.py) against plain references written here.

* ``price_items``: the packing order is a stable sort by length, each minimum size is
  ``ScheduleProblem.min_feasible_size``, and every price (computed with the cost model's array
  form) equals the scalar form bit for bit;
* ``drafts_to_schedule``: the same Schedule as a per-block, per-rank layout, on generated
  drafts (every mix of block sizes of a doubling chain, idle ranks, empty micro-batches,
  sequence-parallel padding);
* the draft's block operations keep times and tokens equal to a fresh pricing of the block."""

import random

import numpy as np

from megatron.varlen.scheduling import CostModel, ScheduleProblem
from megatron.varlen.scheduling.draft import MicrobatchDraft, drafts_to_schedule, price_bag
from megatron.varlen.scheduling.pricing import price_items
from megatron.varlen.scheduling.problem import Schedule, padded_length


def test_prices_match_the_scalar_cost_model():
    rng = random.Random(8)
    for index in range(100):
        num_ranks, cp_size = rng.choice([(8, 2), (16, 4), (64, 8)])
        budget, sp_factor = rng.choice([512, 1000, 4096]), rng.choice([1, 2, 4])
        distinct = [rng.randint(1, budget * num_ranks // 2) for _ in range(rng.randint(1, 20))]
        lengths = tuple(rng.choice(distinct) for _ in range(rng.randint(1, 300)))
        cost = (CostModel(), CostModel(a=0.37, b=11.0, g=3.0, d=5.0))[index % 2]
        problem = ScheduleProblem(lengths=lengths, dp_size=num_ranks // cp_size,
                                  cp_size=cp_size, max_seqlen_per_rank=budget,
                                  sp_factor=sp_factor, cost=cost)
        sizes = problem.layout.sequence_sizes
        prices = price_items(problem, sizes, "")
        assert prices.order == sorted(range(len(lengths)), key=lambda seq: -lengths[seq])
        for seq, length in enumerate(lengths):
            size = prices.min_size[seq]
            assert size == problem.min_feasible_size(length, sizes)
            padded = padded_length(length, size, sp_factor)
            assert prices.min_time[seq] == cost.time(padded, size)
            assert prices.min_tokens[seq] == padded // size
            assert prices.min_work[seq] == prices.min_time[seq] * size
            for other in sizes:
                if other != size:
                    assert prices.time_tokens(seq, other) == (
                        cost.time(padded_length(length, other, sp_factor), other),
                        padded_length(length, other, sp_factor) // other)


def _plain_schedule(problem, drafts):
    cp_sizes = [0] * problem.num_sequences
    microbatches = []
    for draft in drafts:
        ranks, start = [()] * problem.num_ranks, 0
        for block in sorted(range(len(draft.sizes)), key=lambda b: -draft.sizes[b]):
            size, ids = draft.sizes[block], tuple(draft.members[block])
            ranks[start:start + size] = [ids] * size
            for seq in ids:
                cp_sizes[seq] = size
            start += size
        microbatches.append(tuple(ranks))
    padded = [padded_length(length, max(size, 1), problem.sp_factor)
              for length, size in zip(problem.lengths, cp_sizes)]
    return Schedule(microbatches=tuple(microbatches), cp_sizes=tuple(cp_sizes),
                    padded_lengths=tuple(padded))


def _random_drafts(rng):
    num_ranks = rng.choice([1, 2, 4, 8, 16, 64])
    num_sequences = rng.randint(0, 6 * num_ranks)
    problem = ScheduleProblem(
        lengths=tuple(rng.randint(1, 5000) for _ in range(num_sequences)), dp_size=num_ranks,
        cp_size=1, max_seqlen_per_rank=8192, sp_factor=rng.choice([1, 1, 2]), cost=CostModel())
    seqs = list(range(num_sequences))
    rng.shuffle(seqs)
    drafts = []
    while seqs or not drafts or rng.random() < 0.1:
        draft, free = MicrobatchDraft(free_ranks=0), num_ranks
        while free and seqs:
            size = rng.choice([s for s in (1, 2, 4, 8, 16) if s <= free])
            draft.sizes.append(size)
            draft.members.append([seqs.pop() for _ in range(min(rng.randint(1, 4), len(seqs)))])
            free -= size
            if rng.random() < 0.15:
                break  # leave ranks idle
        drafts.append(draft)
    return problem, drafts


def test_layout_matches_the_plain_one():
    rng = random.Random(21)
    for _ in range(300):
        problem, drafts = _random_drafts(rng)
        assert drafts_to_schedule(problem, drafts) == _plain_schedule(problem, drafts)


def test_block_operations_keep_prices_consistent():
    lengths = tuple(range(100, 2100, 100))
    problem = ScheduleProblem(lengths=lengths, dp_size=16, cp_size=1, max_seqlen_per_rank=4096,
                              cost=CostModel())
    pricing = price_items(problem, problem.layout.sequence_sizes, "")
    rng = random.Random(5)
    for _ in range(100):
        draft, seqs = MicrobatchDraft(free_ranks=16), rng.sample(range(len(lengths)), 12)
        for seq in seqs[:8]:
            size = rng.choice([1, 2])
            time, tokens = pricing.time_tokens(seq, size)
            draft.open_block(seq, size, time + pricing.latency(size), tokens)
        for seq in seqs[8:]:
            block = rng.randrange(len(draft.sizes))
            draft.add(block, seq, *pricing.time_tokens(seq, draft.sizes[block]))
        block = rng.randrange(len(draft.sizes))
        if draft.free_ranks >= draft.sizes[block]:
            draft.resize_block(block, 2 * draft.sizes[block],
                               *draft.reprice_block(block, 2 * draft.sizes[block], pricing))
        ones = {block for block, size in enumerate(draft.sizes) if size == 1}
        if len(ones) >= 2 and draft.free_ranks >= 2:
            chosen = set(sorted(ones)[:2])
            merged = [seq for block in sorted(chosen) for seq in draft.members[block]]
            draft.merge_blocks(chosen, 4, *price_bag(merged, 4, pricing))
        block = max(range(len(draft.sizes)), key=lambda block: len(draft.members[block]))
        if len(draft.members[block]) > 1:
            seq = draft.members[block][0]
            draft.remove(block, seq, *pricing.time_tokens(seq, draft.sizes[block]))
        for block, size in enumerate(draft.sizes):
            time, tokens = draft.reprice_block(block, size, pricing)
            assert np.isclose(draft.times[block], time) and draft.tokens[block] == tokens
        assert draft.free_ranks + sum(draft.sizes) == 16
        assert sorted(draft.item_ids()) == sorted(set(draft.item_ids()))
