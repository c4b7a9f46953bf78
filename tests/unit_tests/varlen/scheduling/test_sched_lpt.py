"""LPT in sorted rounds (lpt.py) and the front phase built on it (front.py), against heaps.

* ``LeastLoaded`` answers every query of a random mix of peeks, pops and pushes (raised
  entries, ties, entries pushed below the unread ones) exactly as ``heapq`` does;
* ``fill_front`` (blocks, then LPT over one load order per block size) leaves every draft and
  queue exactly as a plain reference written here with one heap per size and a heap step per
  sequence, on generated batches full of ties, budget stops and mixed group sizes, with and
  without growth caps."""

import heapq
import random

from megatron.varlen.scheduling import CostModel, ScheduleProblem
from megatron.varlen.scheduling.draft import MicrobatchDraft
from megatron.varlen.scheduling.front import STACKING_WORK_SLACK, fill_front, size_under_cap
from megatron.varlen.scheduling.lpt import LeastLoaded
from megatron.varlen.scheduling.pricing import price_items
from megatron.varlen.scheduling.seq_queue import SequenceQueue


def test_least_loaded_answers_as_a_heap():
    rng = random.Random(3)
    for _ in range(300):
        count = rng.randint(1, 30)
        entries = [(float(rng.randint(0, 6)), block) for block in range(count)]
        loads, heap = LeastLoaded(entries), list(entries)
        heapq.heapify(heap)
        for _ in range(rng.randint(1, 80)):
            assert len(loads) == len(heap)
            if not heap:
                assert loads.least() == (float("inf"), float("inf"))
                break
            assert loads.least() == heap[0]
            if rng.random() < 0.8:  # raise the least block (LPT), sometimes by nothing
                time, block = loads.pop_least()
                assert (time, block) == heapq.heappop(heap)
                raised = (time + rng.choice([0.0, 1.0, 3.0, rng.random()]), block)
                if rng.random() < 0.9:
                    loads.push(raised)
                    heapq.heappush(heap, raised)
            else:  # drop it (a hole that fits nothing)
                assert loads.pop_least() == heapq.heappop(heap)


def _plain_front(draft, pricing, queue, cap):
    """Blocks while ranks are free, then one heap step per sequence onto the least (time,
    block) of each size that can take it (the front phase as first written)."""
    available = [pos for pos in range(queue.end) if queue.first(pos) == pos]
    for pos in available:
        seq = pricing.order[pos]
        size = size_under_cap(pricing, seq, cap)
        if size > draft.free_ranks:
            break
        time, tokens = pricing.time_tokens(seq, size)
        draft.open_block(seq, size, time + pricing.cost.group_latency(size), tokens)
        draft.absorbed_work += pricing.min_work[seq]
        queue.take(pos)
    pos = queue.first()
    heaps = {}
    for block, (size, time) in enumerate(zip(draft.sizes, draft.times)):
        heaps.setdefault(size, []).append((time, block))
    for heap in heaps.values():
        heapq.heapify(heap)
    while pos < queue.end:
        seq = pricing.order[pos]
        smallest = size_under_cap(pricing, seq, cap)
        options = []
        for size, heap in heaps.items():
            time, tokens = pricing.time_tokens(seq, size)
            top_time, block = heap[0]
            if size >= smallest and draft.tokens[block] + tokens <= pricing.budget:
                options.append((top_time + time, block, time, tokens))
        if not options:
            return
        end_time, block, time, tokens = min(options)
        if end_time > draft.level:
            if draft.times[block] > min(heap[0][0] for heap in heaps.values()):
                return  # the least-loaded block is out of tokens
            extra = draft.sizes[block] * time - pricing.min_work[seq]
            if extra > STACKING_WORK_SLACK * pricing.min_work[seq]:
                return  # riding a larger group costs more than it balances
        draft.add(block, seq, time, tokens)
        draft.absorbed_work += pricing.min_work[seq]
        heapq.heapreplace(heaps[draft.sizes[block]], (draft.times[block], block))
        queue.take(pos)
        pos = queue.first(pos + 1)


def _cases():
    rng = random.Random(17)
    costs = (CostModel(), CostModel(a=1.0, b=0.0, g=0.0, d=0.0),
             CostModel(a=0.0, b=1.0, g=0.0, d=0.0), CostModel(a=1.0, b=192.0, g=50.0, d=6e4))
    for index in range(400):
        num_ranks, cp_size = rng.choice([(4, 1), (8, 1), (8, 2), (16, 4), (32, 4), (64, 2)])
        budget = rng.choice([16, 64, 512, 1024, 4096])
        # Few distinct lengths: equal loads, so ties between blocks are everywhere.
        palette = [rng.randint(1, budget * rng.choice([1, cp_size, num_ranks]) // 2)
                   for _ in range(rng.randint(1, 6))]
        lengths = tuple(rng.choice(palette) if rng.random() < 0.9 else rng.randint(1, 64)
                        for _ in range(rng.randint(1, 20 * num_ranks)))
        problem = ScheduleProblem(lengths=lengths, dp_size=num_ranks // cp_size,
                                  cp_size=cp_size, max_seqlen_per_rank=budget,
                                  cost=costs[index % len(costs)])
        sizes = problem.layout.sequence_sizes if index % 3 else (cp_size,)
        try:
            pricing = price_items(problem, sizes, "")
        except ValueError:
            continue  # a static CP group too small for the longest sequence
        taken = [pos for pos in range(len(lengths)) if rng.random() < 0.1]  # earlier holes
        cap = None if rng.random() < 0.5 else rng.random() * max(pricing.min_time) * 1.5
        yield pricing, taken, cap


def test_front_places_as_the_heap_loop():
    placed = 0
    for pricing, taken, cap in _cases():
        results = []
        for front in (fill_front, _plain_front):
            queue = SequenceQueue(pricing.order, pricing.lengths)
            for pos in taken:
                queue.take(pos)
            draft = MicrobatchDraft(free_ranks=pricing.num_ranks)
            front(draft, pricing, queue, cap)
            results.append((draft, queue.remaining, [queue.first(pos) for pos in
                                                     range(queue.end + 1)]))
        assert results[0] == results[1]
        placed += results[0][0].num_items - len(results[0][0].sizes)
    assert placed > 2000, "LPT placed too few sequences to be tested"
