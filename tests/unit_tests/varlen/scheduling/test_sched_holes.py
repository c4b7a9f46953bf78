"""Best fit (holes.py) and the cost model's inverse it relies on.

* ``CostModel.longest_fitting`` against a brute-force scan of padded lengths;
* ``best_fit`` against a brute-force scan (the longest padded length that fits, then the
  queue's first few sequences at most that long);
* ``fill_holes`` (least-loaded block first, ending once no block has room for the shortest
  queued sequence) leaves every draft and queue as the plain loop written here, which asks
  best fit for every block until none fits; the ``SequenceQueue`` answers (``first``,
  ``last``, ``longest_at_most``) against sets of available positions."""

import random

import numpy as np
import pytest

from megatron.varlen.scheduling import CostModel, ScheduleProblem
from megatron.varlen.scheduling.draft import MicrobatchDraft
from megatron.varlen.scheduling.front import fill_front
from megatron.varlen.scheduling.holes import BEST_FIT_PROBES, best_fit, fill_holes
from megatron.varlen.scheduling.pricing import price_items
from megatron.varlen.scheduling.problem import pad_multiple
from megatron.varlen.scheduling.seq_queue import SequenceQueue

COSTS = (CostModel(), CostModel(a=1.0, b=0.0, g=0.0, d=0.0), CostModel(a=0.0, b=1.0, g=0.0, d=0.0),
         CostModel(a=1.0, b=192.0, g=50.0, d=6e4), CostModel(a=0.3, b=7.0, g=2.5, d=1.0))
RELATIVE = 1e-9  # float slack of the quadratic's root


@pytest.mark.parametrize("cost", COSTS)
def test_longest_fitting_is_the_brute_force_longest(cost):
    rng = random.Random(2)
    for _ in range(300):
        size = rng.choice([1, 2, 4, 8])
        token_room = rng.randint(0, 3000)
        time_room = cost.time(rng.randint(0, 4000) * size, size) * rng.uniform(0.5, 1.5)
        longest = cost.longest_fitting(time_room, token_room, size)
        padded = np.arange(0, 4 * 4000 * size + 1, size)
        fitting = padded[(cost.time(padded, size) <= time_room)
                         & (cost.tokens(padded, size) <= token_room)]
        assert longest == pytest.approx(fitting.max(), rel=RELATIVE, abs=size)
        assert cost.time(int(longest), size) <= time_room * (1 + RELATIVE)


def _problems():
    rng = random.Random(11)
    for index in range(120):
        num_ranks, cp_size = rng.choice([(4, 2), (8, 2), (16, 4), (64, 8)])
        budget = rng.choice([512, 2048, 8192])
        # Mixtures of short and long lengths leave holes that only the short ones fill.
        lengths = tuple(rng.choice([rng.randint(16, 256), rng.randint(1, budget * cp_size)])
                        for _ in range(rng.randint(num_ranks, 12 * num_ranks)))
        yield ScheduleProblem(lengths=lengths, dp_size=num_ranks // cp_size, cp_size=cp_size,
                              max_seqlen_per_rank=budget, sp_factor=rng.choice([1, 2]),
                              cost=COSTS[index % len(COSTS)])


def _expected_fit(pricing, queue, size, time_room, token_room):
    """Best fit by brute force: the longest padded length R (a multiple of the padding) that
    fits both rooms; every queued sequence at most R long fits (its padded length is <= R),
    none longer does; of the first BEST_FIT_PROBES such, the first allowed on ``size`` ranks."""
    multiple = pad_multiple(size, pricing.sp_factor)
    padded = np.arange(0, max(pricing.lengths) + 2 * multiple, multiple)
    fits = (pricing.cost.time(padded, size) <= time_room) & (
        pricing.cost.tokens(padded, size) <= token_room)
    longest = padded[fits].max()
    candidates = [pos for pos in range(queue.end) if queue.first(pos) == pos
                  and pricing.lengths[pricing.order[pos]] <= longest][:BEST_FIT_PROBES]
    return next((pos for pos in candidates if pricing.min_size[pricing.order[pos]] <= size), None)


def test_best_fit_takes_the_longest_that_fits():
    rng = random.Random(4)
    found = 0
    for problem in _problems():
        pricing = price_items(problem, problem.layout.sequence_sizes, "")
        queue = SequenceQueue(pricing.order, pricing.lengths)
        for pos in range(len(problem.lengths)):
            if rng.random() < 0.3:
                queue.take(pos)
        for size in pricing.sizes:
            time_room = rng.uniform(0.0, 2.0) * max(pricing.min_time)
            token_room = rng.randint(0, pricing.budget)
            result = best_fit(pricing, queue, size, time_room, token_room)
            expected = _expected_fit(pricing, queue, size, time_room, token_room)
            assert (result and result[0]) == expected, (problem, size, time_room, token_room)
            if result is not None:
                pos, seq, time, tokens = result
                assert (seq, time, tokens) == (pricing.order[pos],
                                               *pricing.time_tokens(seq, size))
                assert time <= time_room and tokens <= token_room
                found += 1
    assert found > 200, found


def _plain_fill_holes(draft, pricing, queue):
    """Every block, least loaded first, asks best fit until it fits nothing."""
    level, full = draft.level, set()
    while queue.remaining and len(full) < len(draft.sizes):
        time, block = min((time, block) for block, time in enumerate(draft.times)
                          if block not in full)
        found = best_fit(pricing, queue, draft.sizes[block], level - time,
                         pricing.budget - draft.tokens[block])
        if found is None:
            full.add(block)
            continue
        pos, seq, seq_time, tokens = found
        draft.add(block, seq, seq_time, tokens)
        draft.absorbed_work += pricing.min_work[seq]
        queue.take(pos)


def test_fill_holes_matches_the_plain_loop():
    filled = 0
    for problem in _problems():
        pricing = price_items(problem, problem.layout.sequence_sizes, "")
        queue = SequenceQueue(pricing.order, pricing.lengths)
        while queue.remaining:
            results = []
            for fill in (fill_holes, _plain_fill_holes):
                trial = queue.copy()
                draft = MicrobatchDraft(free_ranks=pricing.num_ranks)
                fill_front(draft, pricing, trial)
                fill(draft, pricing, trial)
                results.append((draft, trial))
            (draft, trial), (plain, plain_queue) = results
            assert draft == plain
            assert [trial.first(pos) for pos in range(trial.end)] == [
                plain_queue.first(pos) for pos in range(trial.end)]
            filled += queue.remaining - trial.remaining - len(draft.sizes)
            queue = trial
    assert filled > 300, filled


def test_queue_answers_match_sets_of_available_positions():
    rng = random.Random(3)
    lengths = [rng.randint(1, 30) for _ in range(60)]
    order = sorted(range(60), key=lambda seq: -lengths[seq])
    queue, available, copies = SequenceQueue(order, lengths), set(range(60)), []
    while available:
        pos = rng.choice(sorted(available)) if rng.random() < 0.5 else max(available)
        queue.take(pos)
        available.discard(pos)
        assert queue.remaining == len(available)
        assert queue.last() == max(available, default=-1)
        for start in range(61):
            assert queue.first(start) == min((p for p in available if p >= start), default=60)
        for length in range(32):
            expected = min((p for p in available if lengths[order[p]] <= length), default=60)
            assert queue.longest_at_most(length) == expected
        if rng.random() < 0.2:
            copies.append((queue.copy(), set(available)))
    for copy, still in copies:  # a copy is independent and scans on from where it was
        if still:
            copy.take(max(still))
            still.discard(max(still))
        assert copy.last() == max(still, default=-1)

