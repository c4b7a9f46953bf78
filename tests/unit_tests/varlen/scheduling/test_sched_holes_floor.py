"""Latency shortcuts of the packing loops change no schedule:

* the hole search (packing._hole_search: closure locals, the root of the cost's quadratic
  computed inline) finds the same sequence as the plain best fit written out below;
* the hole-filling phase stops once no block has time room for the shortest *queued*
  sequence (packing._fill_holes, SequenceQueue.last): the same schedules as the plain loop that
  asks best fit for every block until the heap is empty;
* the front loops link their taken runs in one hop (SequenceQueue.skip_taken) instead of one
  link per position: the same schedules as with the plain links, and ``first`` gives the same
  answers."""

import math
import random
from bisect import bisect_left
from heapq import heapify, heappop, heapreplace

import pytest

from megatron.varlen.scheduling import CostModel, ScheduleProblem, get_scheduler
from megatron.varlen.scheduling import packing
from megatron.varlen.scheduling.problem import CHUNKS_PER_CP_RANK
from megatron.varlen.scheduling.seq_queue import SequenceQueue


def _max_fitting_length(pricing, size, time_room, token_room):
    """Longest length whose per-rank time on ``size`` ranks is at most ``time_room`` and whose
    per-rank tokens are at most ``token_room``, rounded down to the padding multiple."""
    linear = pricing.b + (pricing.g * (size - 1) if size > 1 else 0.0)
    scaled = size * time_room
    if pricing.a > 0.0:
        root = math.sqrt(linear * linear + 4.0 * pricing.a * scaled)
        by_time = (root - linear) / (2.0 * pricing.a)
    else:
        by_time = scaled / linear
    multiple = CHUNKS_PER_CP_RANK * size * pricing.sp_factor if size > 1 else pricing.sp_factor
    return int(min(by_time, token_room * size)) // multiple * multiple


def _plain_best_fit(draft, pricing, queue, block, time_room):
    """Longest queued sequence that fits ``block`` (position, sequence, time, tokens)."""
    size = draft.sizes[block]
    token_room = pricing.budget - draft.tokens[block]
    if token_room * size < pricing.lengths[queue.order[-1]]:
        return None
    max_length = _max_fitting_length(pricing, size, time_room, token_room)
    if max_length < 1:
        return None
    pos = queue.first(bisect_left([-pricing.lengths[seq] for seq in queue.order], -max_length))
    for _ in range(packing.BEST_FIT_PROBES):
        if pos >= queue.end:
            return None
        seq = queue.order[pos]
        if pricing.min_size[seq] <= size:
            time, tokens = pricing.time_tokens(seq, size)
            if time <= time_room and tokens <= token_room:
                return pos, seq, time, tokens
        pos = queue.first(pos + 1)
    return None


def _plain_fill_holes(draft, pricing, queue):
    """The un-optimised phase: no early stop, every block is tried until it fits nothing,
    block and queue updates through their methods."""
    level = draft.level
    heap = [(time, block) for block, time in enumerate(draft.times)]
    heapify(heap)
    while heap and queue.remaining:
        top_time, block = heap[0]
        found = _plain_best_fit(draft, pricing, queue, block, level - top_time)
        if found is None:
            heappop(heap)
            continue
        pos, seq, time, tokens = found
        draft.add(block, seq, time, tokens)
        draft.absorbed_work += pricing.min_work[seq]
        queue.take(pos)
        heapreplace(heap, (draft.times[block], block))


def _problems():
    rng = random.Random(11)
    costs = (CostModel(), CostModel(a=1.0, b=0.0, g=0.0, d=0.0),
             CostModel(a=1.0, b=192.0, g=50.0, d=6e4))
    for index in range(60):
        num_ranks, cp_size = rng.choice([(4, 2), (8, 2), (16, 4), (64, 8)])
        budget = rng.choice([512, 2048, 8192])
        # Mixtures of short and long lengths leave holes that only the short ones fill.
        lengths = tuple(rng.choice([rng.randint(16, 256), rng.randint(1, budget * cp_size)])
                        for _ in range(rng.randint(num_ranks, 12 * num_ranks)))
        yield ScheduleProblem(lengths=lengths, dp_size=num_ranks // cp_size, cp_size=cp_size,
                              max_seqlen_per_rank=budget, cost=costs[index % len(costs)])


@pytest.fixture(scope="module")
def fast_schedules():
    """The generated problems and their schedules with every shortcut on (computed once for
    the tests below, which each turn one shortcut off and reschedule)."""
    problems = list(_problems())
    return problems, _schedule_all(problems)


def _schedule_all(problems):
    scheduler = get_scheduler("default_dynamic_cp")
    return [scheduler(problem) for problem in problems]


def test_early_stop_changes_no_schedule(monkeypatch, fast_schedules):
    problems, fast = fast_schedules
    monkeypatch.setattr(packing, "_fill_holes", _plain_fill_holes)
    assert _schedule_all(problems) == fast


def test_last_is_the_largest_available_position():
    rng = random.Random(3)
    queue = SequenceQueue(list(range(50)), [50 - seq for seq in range(50)])
    available = set(range(50))
    copies = []
    while available:
        pos = rng.choice(sorted(available)) if rng.random() < 0.5 else max(available)
        queue.take(pos)
        available.discard(pos)
        assert queue.last() == max(available, default=-1)
        if rng.random() < 0.2:
            copies.append((queue.copy(), set(available)))
    for copy, still in copies:  # a copy scans on from where its original was
        copy.take(max(still)) if still else None
        still.discard(max(still, default=None))
        assert copy.last() == max(still, default=-1)


def test_one_hop_links_change_no_schedule(monkeypatch, fast_schedules):
    problems, fast = fast_schedules

    def one_link_per_position(queue, start, stop):
        queue.next_available[start:stop] = range(start + 1, stop + 1)

    monkeypatch.setattr(SequenceQueue, "skip_taken", one_link_per_position)
    assert _schedule_all(problems) == fast


def test_skip_taken_keeps_first_answers():
    rng = random.Random(5)
    queue = SequenceQueue(list(range(40)), [40 - seq for seq in range(40)])
    available = set(range(40))
    for start in range(0, 36, 6):
        stop = start + rng.randint(1, 5)
        for pos in range(start, stop):
            if pos in available:
                queue.take(pos)
                available.discard(pos)
        queue.skip_taken(start, stop)
        for pos in range(41):
            assert queue.first(pos) == min((p for p in available if p >= pos), default=40)
