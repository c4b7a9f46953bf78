"""The scheduler's latency shortcuts give what the plain code written out here gives:

* drafts_to_schedule's fast layout (sizes written only for groups of more than one rank,
  tuples repeated per size run) and the plain per-block, per-sequence layout, on generated
  drafts: every mix of block sizes of a doubling chain, idle ranks, empty micro-batches,
  sequence-parallel padding;
* price_items' packing order (one sort of packed keys) and per-rank tokens (no division)
  and a stable argsort and padded_length // size, on generated batches full of ties."""

import random

import numpy as np

from megatron.varlen.scheduling import CostModel, ScheduleProblem
from megatron.varlen.scheduling import pricing
from megatron.varlen.scheduling.draft import MicrobatchDraft, drafts_to_schedule
from megatron.varlen.scheduling.problem import CHUNKS_PER_CP_RANK, Schedule, padded_length


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
    lengths = np.asarray(problem.lengths, dtype=np.int64)
    sizes = np.asarray(cp_sizes, dtype=np.int64)
    multiple = np.where(sizes > 1, CHUNKS_PER_CP_RANK * sizes * problem.sp_factor,
                        problem.sp_factor)
    return Schedule(microbatches=tuple(microbatches), cp_sizes=tuple(cp_sizes),
                    padded_lengths=tuple((-(-lengths // multiple) * multiple).tolist()))


def _random_case(rng):
    num_ranks = rng.choice([1, 2, 4, 8, 16, 64])
    num_sequences = rng.randint(0, 6 * num_ranks)
    sp_factor = rng.choice([1, 1, 2])
    problem = ScheduleProblem(
        lengths=tuple(rng.randint(1, 5000) for _ in range(num_sequences)), dp_size=num_ranks,
        cp_size=1, max_seqlen_per_rank=8192, sp_factor=sp_factor, cost=CostModel())
    seqs = list(range(num_sequences))
    rng.shuffle(seqs)
    drafts = []
    while seqs or not drafts or rng.random() < 0.1:
        draft, free = MicrobatchDraft(free_ranks=0), num_ranks
        while free and (seqs or rng.random() < 0.2):
            size = rng.choice([s for s in (1, 2, 4, 8, 16) if s <= free])
            take = rng.randint(1, 4) if rng.random() < 0.9 else 0
            draft.sizes.append(size)
            draft.members.append([seqs.pop() for _ in range(min(take, len(seqs)))])
            free -= size
            if rng.random() < 0.15:
                break  # leave ranks idle
        drafts.append(draft)
    # Blocks are laid out largest first, so any order of sizes is aligned on a doubling chain.
    return problem, drafts


def test_fast_layout_matches_the_plain_one():
    rng = random.Random(21)
    for _ in range(300):
        problem, drafts = _random_case(rng)
        assert drafts_to_schedule(problem, drafts) == _plain_schedule(problem, drafts)


def test_pricing_order_and_tokens_match_the_plain_computation():
    rng = random.Random(8)
    for _ in range(100):
        num_ranks, cp_size = rng.choice([(8, 2), (16, 4), (64, 8)])
        budget, sp_factor = rng.choice([512, 1000, 4096]), rng.choice([1, 2, 4])
        distinct = [rng.randint(1, budget * num_ranks // 2) for _ in range(rng.randint(1, 20))]
        lengths = tuple(rng.choice(distinct) for _ in range(rng.randint(1, 300)))
        problem = ScheduleProblem(lengths=lengths, dp_size=num_ranks // cp_size,
                                  cp_size=cp_size, max_seqlen_per_rank=budget,
                                  sp_factor=sp_factor, cost=CostModel())
        prices = pricing.price_items(problem, problem.layout.sequence_sizes, "")
        assert prices.order == sorted(range(len(lengths)), key=lambda seq: -lengths[seq])
        assert prices.min_tokens == [
            padded_length(length, size, sp_factor) // size
            for length, size in zip(lengths, prices.min_size)]


def test_packing_order_falls_back_to_argsort_for_huge_lengths():
    lengths = np.asarray([5, 1 << 55, 5, 1 << 55, 7], dtype=np.int64)
    assert pricing._packing_order(lengths) == [1, 3, 4, 0, 2]
    assert pricing._packing_order(np.asarray([], dtype=np.int64)) == []
