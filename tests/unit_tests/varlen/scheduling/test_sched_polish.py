"""The small-batch polish (polish.py): exchanges within a micro-batch and trims of a shared top.

Hand-built micro-batches are checked against values worked out from the cost model formula
(docs/SCHEDULING.md, "Cost model") and against a brute-force partition; whole schedules against
the same scheduler with the polish switched off (every move strictly shortens the critical
path, so no schedule may get longer)."""

import itertools
import random

import pytest

from megatron.varlen.scheduling import CostModel, ScheduleProblem, get_scheduler
from megatron.varlen.scheduling import polish
from megatron.varlen.scheduling.draft import MicrobatchDraft
from megatron.varlen.scheduling.pricing import price_items
from megatron.varlen.scheduling.schedule_evaluation import microbatch_levels
from megatron.varlen.scheduling.validate import validate_schedule
from tools.scheduling.benchmark import WORKLOADS, make_problem, sample_batches

ATTENTION_ONLY = CostModel(a=1.0, b=0.0, g=0.0, d=0.0)  # t(L, c) = padded(L, c)^2 / c


def _time(length: int, size: int) -> float:
    """The cost model's per-rank time with a = 1 and b = g = d = 0, written out here."""
    padded = length if size == 1 else -(-length // (2 * size)) * (2 * size)
    return padded * padded / size


def _draft(lengths: tuple[int, ...], blocks: list[tuple[int, list[int]]]) -> MicrobatchDraft:
    """A micro-batch with the given (size, member ids) blocks, priced by ``_time``."""
    return MicrobatchDraft(
        free_ranks=0, sizes=[size for size, _ in blocks],
        times=[sum(_time(lengths[seq], size) for seq in members) for size, members in blocks],
        tokens=[sum(-(-lengths[seq] // size) for seq in members) for size, members in blocks],
        members=[list(members) for _, members in blocks])


def _pricing(lengths: tuple[int, ...], num_ranks: int, budget: int):
    problem = ScheduleProblem(lengths=lengths, dp_size=num_ranks, cp_size=1,
                              max_seqlen_per_rank=budget, cost=ATTENTION_ONLY)
    return price_items(problem, problem.layout.sequence_sizes, "")


def test_exchange_swaps_to_the_best_two_way_split():
    # 6^2 + 5^2 = 61 against 4^2 + 3^2 = 25. No single relocation gets below 50, a swap
    # reaches 45 = max(36 + 9, 25 + 16), the best split of {36, 25, 16, 9} (brute force).
    lengths = (6, 5, 4, 3)
    draft = _draft(lengths, [(1, [0, 1]), (1, [2, 3])])
    polish.polish_small_batch([draft], _pricing(lengths, 2, budget=100))
    best = min(max(sum(length ** 2 for length in part),
                   sum(length ** 2 for length in lengths) - sum(length ** 2 for length in part))
               for count in range(len(lengths) + 1)
               for part in itertools.combinations(lengths, count))
    assert best == 45
    assert draft.level == best
    assert sorted(map(sorted, draft.members)) == [[0, 3], [1, 2]]


def _random_microbatch(rng: random.Random):
    """A feasible random micro-batch of 2-3 single-rank blocks, its lengths and budget."""
    while True:
        lengths = tuple(rng.randint(1, 20) for _ in range(rng.randint(4, 7)))
        num_blocks, budget = rng.randint(2, 3), rng.randint(15, 40)
        owner = [rng.randrange(num_blocks) for _ in lengths]
        blocks = [(1, [seq for seq in range(len(lengths)) if owner[seq] == block])
                  for block in range(num_blocks)]
        if all(members and sum(lengths[seq] for seq in members) <= budget
               for _, members in blocks):
            return lengths, budget, _draft(lengths, blocks)


def _best_split(lengths, budget, num_blocks):
    """Brute force: the lowest level of any split into non-empty blocks within the budget."""
    best = float("inf")
    for owner in itertools.product(range(num_blocks), repeat=len(lengths)):
        loads = [[length for length, block in zip(lengths, owner) if block == index]
                 for index in range(num_blocks)]
        if all(load and sum(load) <= budget for load in loads):
            best = min(best, max(sum(length * length for length in load) for load in loads))
    return best


def test_exchange_keeps_the_budget_and_only_lowers_the_level():
    rng = random.Random(11)
    reached = 0
    for _ in range(150):
        lengths, budget, draft = _random_microbatch(rng)
        start = draft.level
        polish.polish_small_batch([draft], _pricing(lengths, len(draft.sizes), budget))
        loads = [[lengths[seq] for seq in members] for members in draft.members]
        assert sorted(seq for members in draft.members for seq in members) == list(
            range(len(lengths)))
        assert all(load and sum(load) <= budget for load in loads), (lengths, budget, loads)
        assert draft.times == [sum(length * length for length in load) for load in loads]
        optimum = _best_split(lengths, budget, len(loads))
        assert optimum <= draft.level <= start
        reached += draft.level == optimum
    assert reached >= 140, reached  # a local search: most (148 of 150), not all


def test_trim_moves_one_sequence_per_top_block_into_another_microbatch():
    # Micro-batch 1: four ranks, two holding three 10-token sequences (300), two holding two
    # (200): the top is shared, no single move lowers it. Micro-batch 0 has a 2-rank block
    # far below its level (5,000 against 20,000). Moving one 10 from each top rank there
    # costs 2 * t(10, 2) = 2 * 12^2 / 2 = 144 in that block and nothing on its level.
    lengths = (200, 100) + (10,) * 10
    first = _draft(lengths, [(2, [0]), (2, [1])])
    second = _draft(lengths, [(1, [2, 3, 4]), (1, [5, 6, 7]), (1, [8, 9]), (1, [10, 11])])
    assert (first.level, second.level) == (20000.0, 300.0)
    drafts = polish.polish_small_batch([first, second], _pricing(lengths, 4, budget=1000))
    assert [draft.level for draft in drafts] == [20000.0, 200.0]
    assert drafts[0].times[1] == 5000.0 + 2 * _time(10, 2)
    assert sorted(len(members) for members in drafts[1].members) == [2, 2, 2, 2]


@pytest.mark.parametrize("rounds", [1, polish.TRIM_ROUNDS])
def test_trims_repeat_and_move_the_quickest_sequence_that_suffices(monkeypatch, rounds):
    # Micro-batch 1: [12, 13, 2] twice (317) and [12, 12] twice (288). Trims, each into the
    # light 2-rank block of micro-batch 0 (no rise there):
    #   to 288: one 12 (144, the quickest >= 29) leaves each top rank -> 173, 173, 288, 288;
    #   to 173: one 12 leaves each 288 rank -> 173, 173, 144, 144;
    #   to 144: the 13 (169 >= 29; the 2 is too quick) leaves each 173 rank -> 4, 4, 144, 144;
    #   no further cut leaves a sequence behind (the 12s are alone).
    # Micro-batch 0's light block gains four 12s and two 13s: t(12, 2) = 12^2 / 2 = 72,
    # t(13, 2) = 16^2 / 2 = 128 (13 padded to a multiple of 2 * 2).
    lengths = (200, 100, 12, 13, 2, 12, 13, 2, 12, 12, 12, 12)
    first = _draft(lengths, [(2, [0]), (2, [1])])
    second = _draft(lengths, [(1, [2, 3, 4]), (1, [5, 6, 7]), (1, [8, 9]), (1, [10, 11])])
    assert second.times == [317.0, 317.0, 288.0, 288.0]
    monkeypatch.setattr(polish, "TRIM_ROUNDS", rounds)
    drafts = polish.polish_small_batch([first, second], _pricing(lengths, 4, budget=1000))
    if rounds == 1:
        assert sorted(drafts[1].times) == [173.0, 173.0, 288.0, 288.0]
        assert drafts[0].times[1] == 5000.0 + 2 * 72.0
        return
    assert [draft.level for draft in drafts] == [20000.0, 144.0]
    assert drafts[0].times[1] == 5000.0 + 4 * 72.0 + 2 * 128.0
    assert sorted(drafts[1].times) == [4.0, 4.0, 144.0, 144.0]


def test_trim_is_refused_when_the_rises_cost_more_than_the_cut():
    # The same, but micro-batch 0 is one block at its level: each 10 would raise it by
    # t(10, 4) = 16^2 / 4 = 64, 128 in all, more than the 100 saved.
    lengths = (400,) + (10,) * 10
    first = _draft(lengths, [(4, [0])])
    second = _draft(lengths, [(1, [1, 2, 3]), (1, [4, 5, 6]), (1, [7, 8]), (1, [9, 10])])
    drafts = polish.polish_small_batch([first, second], _pricing(lengths, 4, budget=1000))
    assert [draft.level for draft in drafts] == [_time(400, 4), 300.0]


def _benchmark_like():
    rng = random.Random(3)
    for index in range(48):
        workload = WORKLOADS[index % len(WORKLOADS)]
        num_ranks = rng.choice([8, 16, 32])
        per_rank = rng.choice([2, 4, 8])
        (batch,) = sample_batches(workload, per_rank * num_ranks, 1, seed=index)
        yield make_problem(workload, batch, num_ranks, CostModel(), pp_size=rng.choice([1, 4]))


def test_polish_never_lengthens_a_schedule_and_shortens_some(monkeypatch):
    scheduler = get_scheduler("default_dynamic_cp")
    problems = list(_benchmark_like())
    polished = [scheduler(problem) for problem in problems]
    monkeypatch.setattr(polish, "POLISH_MAX_SEQUENCES", -1)  # today's schedule: no polish
    plain = [scheduler(problem) for problem in problems]
    shorter = 0
    for problem, with_polish, without in zip(problems, polished, plain):
        validate_schedule(problem, with_polish)
        after = sum(microbatch_levels(problem, with_polish))
        before = sum(microbatch_levels(problem, without))
        assert after <= before, (problem.lengths, after / before)
        shorter += after < before
    assert shorter >= len(problems) // 4, shorter


def test_polish_runs_only_on_small_batches():
    assert polish.polish_applies(8 * 64, 64) and not polish.polish_applies(8 * 64 + 1, 64)
    assert not polish.polish_applies(polish.POLISH_MAX_SEQUENCES + 1, 1024)
    # The benchmark's latency targets (64 sequences per rank) never enter.
    assert not polish.polish_applies(64 * 64, 64)
