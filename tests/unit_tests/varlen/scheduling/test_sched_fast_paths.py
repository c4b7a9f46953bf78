"""The scheduler's latency shortcuts give what the plain code written out here gives:

* drafts_to_schedule's fast layout (sizes written only for groups of more than one rank,
  tuples repeated per size run) and the plain per-block, per-sequence layout, on generated
  drafts: every mix of block sizes of a doubling chain, idle ranks, empty micro-batches,
  sequence-parallel padding;
* LPT in sorted rounds (packing._lpt_sorted_rounds) and blocks opened per run of equal sizes
  (packing._open_run) and a plain heap step and a plain loop step per sequence,
  on generated batches full of ties, holes, budget stops and mixed group sizes;
* price_items' packing order (one sort of packed keys), per-rank tokens (no division) and
  minimum work (the time list copied, only sequences on larger groups multiplied) and a
  stable argsort, padded_length // size and numpy's product, on generated batches full of
  ties;
* the queue's next positions across gaps (``SequenceQueue.upcoming``: a slice when there
  are none) and a plain scan, on queues with random taken positions; LPT in sorted rounds
  also on such queues;
* the generic front loop's running level (a comparison per sequence) and the max over the
  draft's blocks."""

import random
from heapq import heapify, heapreplace

import numpy as np

from megatron.varlen.scheduling import CostModel, ScheduleProblem, get_scheduler
from megatron.varlen.scheduling import packing, pricing
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
        assert prices.order_negated_lengths == [-lengths[seq] for seq in prices.order]
        assert prices.min_tokens == [
            padded_length(length, size, sp_factor) // size
            for length, size in zip(lengths, prices.min_size)]
        # Work as numpy's product of the arrays, bit for bit (not only approximately).
        work = prices.min_time_array * np.asarray(prices.min_size, dtype=np.int64)
        assert [value.hex() for value in prices.min_work] == [value.hex() for value in
                                                              work.tolist()]


def test_packing_order_falls_back_to_argsort_for_huge_lengths():
    lengths = np.asarray([5, 1 << 55, 5, 1 << 55, 7], dtype=np.int64)
    assert pricing._packing_order(lengths) == ([1, 3, 4, 0, 2], [-(1 << 55)] * 2 + [-7, -5, -5])
    assert pricing._packing_order(np.asarray([], dtype=np.int64)) == ([], [])


def _plain_lpt(draft, prices, queue, loads, size, pos, absorbed, taken):
    """One heap step per sequence onto the least (time, block); same contract as
    packing._lpt_sorted_rounds (``loads`` left holding every block's entry)."""
    heapify(loads)
    while pos < queue.end:
        seq = prices.order[pos]
        top_time, block = loads[0]
        new_tokens = draft.tokens[block] + prices.min_tokens[seq]
        if prices.min_size[seq] != size or new_tokens > prices.budget:
            break
        draft.times[block] = top_time + prices.min_time[seq]
        draft.tokens[block] = new_tokens
        draft.members[block].append(seq)
        heapreplace(loads, (draft.times[block], block))
        absorbed += prices.min_work[seq]
        taken += 1
        pos = queue.first(pos + 1)
    return pos, absorbed, taken


def _plain_open_run(draft, prices, queue, heaps, pos, free, absorbed, taken, size):
    """One loop step per block."""
    while free >= size and pos < queue.end and prices.min_size[prices.order[pos]] == size:
        seq = prices.order[pos]
        time = prices.min_time[seq] + (prices.d * (size - 1) if size > 1 else 0.0)
        heaps.setdefault(size, []).append((time, len(draft.sizes)))
        draft.sizes.append(size)
        draft.times.append(time)
        draft.tokens.append(prices.min_tokens[seq])
        draft.members.append([seq])
        absorbed += prices.min_work[seq]
        free, taken = free - size, taken + 1
        queue.next_available[pos] = pos + 1
        pos = queue.first(pos + 1)
    return pos, free, absorbed, taken


def _lpt_problems():
    rng = random.Random(17)
    costs = (CostModel(), CostModel(a=1.0, b=0.0, g=0.0, d=0.0),
             CostModel(a=0.0, b=1.0, g=0.0, d=0.0))
    for index in range(30):
        num_ranks, cp_size = rng.choice([(8, 1), (16, 2), (32, 4), (64, 2)])
        budget = rng.choice([512, 1024, 4096])
        # Few distinct lengths: equal loads, so ties between blocks are everywhere.
        distinct = [rng.randint(16, budget * cp_size) for _ in range(rng.randint(2, 6))]
        lengths = tuple(rng.choice(distinct) if rng.random() < 0.9 else rng.randint(1, 64)
                        for _ in range(rng.randint(num_ranks, 20 * num_ranks)))
        yield ScheduleProblem(lengths=lengths, dp_size=num_ranks // cp_size, cp_size=cp_size,
                              max_seqlen_per_rank=budget, cost=costs[index % len(costs)])


def _packed(problems):
    """Every draft's blocks (sizes, times, tokens, members) and absorbed work, as packed."""
    result = []
    for problem in problems:
        for sizes in (problem.layout.sequence_sizes, (problem.cp_size,)):
            prices = pricing.price_items(problem, sizes, "")
            result.append([(draft.sizes, draft.times, draft.tokens, draft.members,
                            draft.absorbed_work)
                           for draft in packing.pack_sequences(prices, allow_growth=True)])
    return result


def test_sorted_rounds_and_run_opening_match_plain_steps(monkeypatch):
    problems = list(_lpt_problems())
    schedulers = [get_scheduler(name) for name in ("default_dynamic_cp", "dp_balanced")]
    fast = [scheduler(problem) for problem in problems for scheduler in schedulers]
    fast_drafts = _packed(problems)
    monkeypatch.setattr(packing, "_lpt_sorted_rounds", _plain_lpt)
    monkeypatch.setattr(packing, "_open_run", _plain_open_run)
    assert [scheduler(problem) for problem in problems for scheduler in schedulers] == fast
    assert _packed(problems) == fast_drafts


def test_sorted_rounds_match_heap_steps_on_tied_loads():
    """Direct comparison on blocks whose loads tie a lot (small integer times, linear cost):
    the tie rule (the lower block first) decides most placements here."""
    from megatron.varlen.scheduling.draft import MicrobatchDraft
    from megatron.varlen.scheduling.seq_queue import SequenceQueue

    rng = random.Random(4)
    for _ in range(300):
        num_blocks, size = rng.randint(1, 12), rng.choice([1, 2])
        budget = 2 * rng.randint(6, 15)
        # With two-rank blocks, lengths above the budget need them and the rest (shorter,
        # so later in the queue) end the run: LPT must stop there.
        choices = [1, 2, 3] if size == 1 else [budget + 2, budget + 4, 2, 4]
        lengths = tuple(rng.choice(choices) for _ in range(rng.randint(1, 60)))
        problem = ScheduleProblem(lengths=lengths, dp_size=num_blocks, cp_size=size,
                                  max_seqlen_per_rank=budget,
                                  cost=CostModel(a=0.0, b=1.0, g=0.0, d=0.0))
        prices = pricing.price_items(problem, (1, size) if size > 1 else (1,), "")
        start = [float(rng.randint(0, 4)) for _ in range(num_blocks)]
        # Positions taken before (holes filled by earlier micro-batches) leave gaps.
        gaps = [pos for pos in range(1, len(lengths)) if rng.random() < 0.15]
        results = []
        for lpt in (packing._lpt_sorted_rounds, _plain_lpt):
            draft = MicrobatchDraft(free_ranks=0, sizes=[size] * num_blocks, times=list(start),
                                    tokens=[int(time) for time in start],
                                    members=[[] for _ in range(num_blocks)])
            queue = SequenceQueue(prices.order, prices.lengths)
            for pos in gaps:
                queue.take(pos)
            loads = sorted((time, block) for block, time in enumerate(start))
            pos, absorbed, taken = lpt(draft, prices, queue, loads, size, 0, 0.0, 0)
            results.append((pos, absorbed, taken, draft.times, draft.tokens, draft.members,
                            sorted(loads)))
        assert results[0] == results[1]


def test_upcoming_matches_a_plain_scan_across_gaps():
    from megatron.varlen.scheduling.seq_queue import SequenceQueue

    rng = random.Random(5)
    for _ in range(200):
        count = rng.randint(1, 80)
        order = rng.sample(range(count), count)
        queue = SequenceQueue(order, [1] * count)
        for pos in range(count):
            if rng.random() < rng.choice([0.0, 0.1, 0.5]):
                queue.take(pos)
        pos, most = queue.first(rng.randint(0, count - 1)), rng.randint(1, 40)
        if pos == queue.end:
            continue
        plain = [at for at in range(pos, count) if queue.next_available[at] == at][:most]
        seqs, positions = queue.upcoming(pos, most)
        assert (list(positions), seqs) == (plain, [order[at] for at in plain])


def test_front_loop_keeps_the_true_level(monkeypatch):
    """The generic front loop tracks the micro-batch's level as it places sequences instead
    of taking max() over every block per sequence: the level it passes on must be that max."""
    checked = []
    should_stop = packing._should_stop_front

    def checking(draft, prices, heaps, seq, best, level):
        assert level == draft.level
        checked.append(level)
        return should_stop(draft, prices, heaps, seq, best, level)

    monkeypatch.setattr(packing, "_should_stop_front", checking)
    scheduler = get_scheduler("default_dynamic_cp")
    for problem in _lpt_problems():
        scheduler(problem)
    assert len(checked) > 100, "the generic front loop was not exercised"
