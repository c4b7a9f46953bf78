"""Growth variants (growth.py): the tail's search skips only caps that would repeat a build.

``growth_caps`` with ``every_size`` leaves out a first sequence's block time on a size when no
queued sequence would grow under it (at or above the no-growth value or the plain level) or
when it reaches the same size thresholds as an earlier cap. Each left-out cap must build a
micro-batch identical to the plain build or to a listed cap's, on batches where many caps share
thresholds (repeated lengths) and long sequences make groups grow."""

import random

from megatron.varlen.scheduling import CostModel, ScheduleProblem, get_scheduler
from megatron.varlen.scheduling.growth import build_microbatch, growth_caps
from megatron.varlen.scheduling.pricing import price_items
from megatron.varlen.scheduling.seq_queue import SequenceQueue


def _problems():
    rng = random.Random(7)
    costs = (CostModel(), CostModel(a=1.0, b=0.0, g=0.0, d=0.0),
             CostModel(a=1.0, b=192.0, g=50.0, d=6e4), CostModel(a=1.0, b=6144.0, g=1600.0, d=2e6))
    for index in range(160):
        num_ranks, cp_size = rng.choice([(2, 1), (4, 2), (8, 2), (8, 4), (16, 4)])
        budget = rng.choice([128, 512, 2048])
        palette = [rng.randint(1, budget * num_ranks) for _ in range(rng.choice([2, 5, 30]))]
        lengths = tuple(rng.choice(palette) for _ in range(rng.randint(2, 3 * num_ranks)))
        yield ScheduleProblem(lengths=lengths, dp_size=num_ranks // cp_size, cp_size=cp_size,
                              max_seqlen_per_rank=budget, cost=costs[index % len(costs)])


def _built(pricing, queue, cap):
    draft = build_microbatch(pricing, queue.copy(), cap)
    return draft.sizes, draft.times, draft.members


def test_skipped_caps_would_only_repeat_a_build():
    skipped = listed = 0
    for problem in _problems():
        pricing = price_items(problem, problem.layout.sequence_sizes, "")
        queue = SequenceQueue(pricing.order, pricing.lengths)
        while queue.remaining:
            plain = _built(pricing, queue, None)
            first = pricing.order[queue.first()]
            caps = list(growth_caps(pricing, queue, max(plain[1]), every_size=True))
            builds = [plain] + [_built(pricing, queue, cap) for cap in caps]
            for size in pricing.sizes:
                if size < pricing.min_size[first]:
                    continue
                cap = pricing.time_tokens(first, size)[0] + pricing.latency(size)
                if cap not in caps:
                    assert _built(pricing, queue, cap) in builds, (problem, size)
                    skipped += 1
            listed += len(caps)
            build_microbatch(pricing, queue)  # on to the next micro-batch
    assert skipped > 100 and listed > 100, (skipped, listed)


def test_tail_growth_spreads_an_attention_heavy_first_sequence():
    # Attention-only cost, one sequence that fits one rank and three short ones: the full
    # search also tries larger groups for a first sequence that needs none, which halves its
    # time here (an attention-heavy case).
    problem = ScheduleProblem(lengths=(512, 16, 16, 16), dp_size=4, cp_size=1,
                              max_seqlen_per_rank=512, cost=CostModel(a=1.0, b=0.0, g=0.0, d=0.0))
    schedule = get_scheduler("default_dynamic_cp")(problem)
    assert schedule.cp_sizes[0] > 1
