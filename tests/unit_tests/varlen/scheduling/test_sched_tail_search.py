"""The tail's growth search skips only caps that would repeat a build (packing.py, step 4 of
docs/SCHEDULING.md): with the skips switched off (no thresholds, no no-growth cap) every
schedule is the same. Small batches are all tail, so every micro-batch goes through it."""

import random

from megatron.varlen.scheduling import CostModel, ScheduleProblem, get_scheduler
from megatron.varlen.scheduling import packing


def _problems():
    rng = random.Random(7)
    costs = (CostModel(), CostModel(a=1.0, b=0.0, g=0.0, d=0.0),
             CostModel(a=1.0, b=192.0, g=50.0, d=6e4), CostModel(a=1.0, b=6144.0, g=1600.0, d=2e6))
    for index in range(240):
        num_ranks, cp_size = rng.choice([(2, 1), (4, 2), (8, 2), (8, 4), (16, 4)])
        budget = rng.choice([128, 512, 2048])
        # Repeated lengths make many caps share thresholds; long ones make groups grow.
        palette = [rng.randint(1, budget * num_ranks) for _ in range(rng.choice([2, 5, 30]))]
        lengths = tuple(rng.choice(palette) for _ in range(rng.randint(2, 3 * num_ranks)))
        yield ScheduleProblem(lengths=lengths, dp_size=num_ranks // cp_size, cp_size=cp_size,
                              max_seqlen_per_rank=budget, cost=costs[index % len(costs)])


def _counting(function, calls):
    def counted(*args, **kwargs):
        calls.append(kwargs.get("cap"))
        return function(*args, **kwargs)
    return counted


def test_skipped_caps_would_only_repeat_a_build(monkeypatch):
    scheduler = get_scheduler("default_dynamic_cp")
    problems = list(_problems())
    built_with_skips, built_without = [], []
    build = packing.build_microbatch
    monkeypatch.setattr(packing, "build_microbatch", _counting(build, built_with_skips))
    with_skips = [scheduler(problem) for problem in problems]
    monkeypatch.setattr(packing, "build_microbatch", _counting(build, built_without))
    thresholds = packing._cap_thresholds
    # Off: no cap counts as growing nothing, and every cap is its own variant.
    monkeypatch.setattr(packing, "_cap_thresholds",
                        lambda pricing, queue: (thresholds(pricing, queue)[0], float("inf")))
    monkeypatch.setattr(packing, "bisect_right", lambda ordered, cap: cap)
    without = [scheduler(problem) for problem in problems]
    capped = [sum(cap is not None for cap in built) for built in (built_with_skips, built_without)]
    assert capped[1] > capped[0] > 0, capped  # the skips do skip variant builds
    for problem, fast, slow in zip(problems, with_skips, without):
        assert (fast.microbatches, fast.cp_sizes) == (slow.microbatches, slow.cp_sizes), problem
