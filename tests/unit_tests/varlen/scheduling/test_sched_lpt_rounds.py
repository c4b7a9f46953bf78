"""LPT in numpy rounds (lpt_rounds.py) places exactly as the heap loop it speeds up.

The reference is the scheduler itself with the rounds switched off (one heap step per
sequence): both must give the same schedule, bit for bit, on batches full of ties (few
distinct lengths), budget stops and mixed group sizes. The rounds normally start at 1,024
blocks; here they are forced on from 2 blocks so small, fast batches exercise them.
"""

import heapq
import random

import pytest

from megatron.varlen.scheduling import CostModel, ScheduleProblem, get_scheduler, validate_schedule
from megatron.varlen.scheduling import lpt_rounds, packing
from megatron.varlen.scheduling.draft import MicrobatchDraft
from megatron.varlen.scheduling.pricing import price_items
from megatron.varlen.scheduling.seq_queue import SequenceQueue

HEAP_ONLY = 10**9


def _problems():
    rng = random.Random(12)
    costs = (CostModel(), CostModel(a=1.0, b=0.0, g=0.0, d=0.0),
             CostModel(a=0.0, b=1.0, g=0.0, d=0.0))
    for index in range(36):
        num_ranks, cp_size = rng.choice([(8, 1), (16, 2), (32, 4), (64, 2)])
        budget = rng.choice([512, 1024, 4096])
        # Few distinct lengths: many equal loads, so the round's tie rule is exercised.
        palette = [rng.randint(16, budget * cp_size) for _ in range(rng.choice([1, 3, 40]))]
        lengths = tuple(rng.choice(palette) for _ in range(rng.randint(num_ranks, 12 * num_ranks)))
        yield ScheduleProblem(lengths=lengths, dp_size=num_ranks // cp_size, cp_size=cp_size,
                              max_seqlen_per_rank=budget, cost=costs[index % len(costs)])
    # Linear cost, small integer lengths: times are exact integers, so a block raised in a
    # round often ties a later one exactly, and blocks fill the token budget exactly.
    for _ in range(60):
        num_ranks = rng.choice([8, 16, 32])
        budget = rng.choice([16, 24, 64, 4096])
        palette = rng.sample([1, 2, 3, 4, 6, 8, 12, 16], rng.randint(2, 4))
        lengths = tuple(rng.choice(palette) for _ in range(rng.randint(num_ranks, 20 * num_ranks)))
        yield ScheduleProblem(lengths=lengths, dp_size=num_ranks, cp_size=1,
                              max_seqlen_per_rank=budget, cost=costs[2])


@pytest.mark.parametrize("min_round", [1, lpt_rounds.MIN_ROUND])
@pytest.mark.parametrize("name", ["default_dynamic_cp", "dp_balanced"])
def test_rounds_place_exactly_as_the_heap_loop(monkeypatch, name, min_round):
    placed_in_rounds = []
    original = lpt_rounds.lpt_in_rounds

    def counting(*args):
        result = original(*args)
        placed_in_rounds.append(result[3])
        return result

    monkeypatch.setattr(packing, "lpt_in_rounds", counting)
    monkeypatch.setattr(lpt_rounds, "MIN_ROUND", min_round)
    scheduler = get_scheduler(name)
    for problem in _problems():
        monkeypatch.setattr(packing, "LPT_ROUNDS_MIN_BLOCKS", HEAP_ONLY)
        reference = scheduler(problem)
        monkeypatch.setattr(packing, "LPT_ROUNDS_MIN_BLOCKS", 2)
        rounds = scheduler(problem)
        validate_schedule(problem, rounds)
        assert rounds.microbatches == reference.microbatches
        assert rounds.cp_sizes == reference.cp_sizes
    assert sum(placed_in_rounds) > 500, "the rounds were not exercised"


def _draft_and_queue():
    """Blocks loaded 2, 1, 4 (index order) and queued sequences of times 4, 2, 1 (linear
    cost, one rank each): the third sequence meets a tie (block 2 at 4 vs block 0 raised to
    4 in the same round), which the heap settles by the lower index."""
    problem = ScheduleProblem(lengths=(4, 2, 1), dp_size=3, cp_size=1, max_seqlen_per_rank=64,
                              cost=CostModel(a=0.0, b=1.0, g=0.0, d=0.0))
    pricing = price_items(problem, problem.layout.sequence_sizes, "")
    draft = MicrobatchDraft(free_ranks=0, sizes=[1, 1, 1], times=[2.0, 1.0, 4.0],
                            tokens=[2, 1, 4], members=[[], [], []])
    heaps = {1: [(time, block) for block, time in enumerate(draft.times)]}
    heapq.heapify(heaps[1])
    return pricing, draft, SequenceQueue(pricing.order, pricing.lengths), heaps


def test_a_tie_inside_a_round_goes_to_the_lower_index(monkeypatch):
    monkeypatch.setattr(lpt_rounds, "MIN_ROUND", 1)
    results = []
    for threshold in (HEAP_ONLY, 2):
        monkeypatch.setattr(packing, "LPT_ROUNDS_MIN_BLOCKS", threshold)
        pricing, draft, queue, heaps = _draft_and_queue()
        packing._lpt_single_size(draft, pricing, queue, heaps, queue.first())
        results.append((draft.times, draft.members, queue.remaining))
    assert results[0] == ([5.0, 5.0, 4.0], [[1, 2], [0], []], 0)  # the heap loop, by hand
    assert results[1] == results[0]
