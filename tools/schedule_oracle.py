"""Exact optimum of tiny scheduling problems (test and benchmark oracle; never used for training).

    from tools.schedule_oracle import solve_exactly
    result = solve_exactly(problem)     # result.critical_path, result.schedule

The search space is exactly what ``default_dynamic_cp`` may produce: every sequence on a group
whose size is in ``problem.layout.sequence_sizes`` (the divisor chain at or above the minimum CP
size), sequences sharing a group share its size (a *bag*), a bag's per-rank padded tokens within
the budget, a micro-batch's bags using at most N ranks (chain sizes then always lay out as
aligned blocks, groups.py), any number of micro-batches. Cost: the cost model of
docs/SCHEDULING.md (a bag of size c costs the sum of its sequences' t(L, c) plus d (c - 1)).

Method: dynamic programming over subsets of sequences, O(3^n * S * N) for n sequences, S sizes
and N ranks (about a second at n = 10, N = 8 in pure Python):

* ``best[X][r]``: the lowest micro-batch level that runs the set X on at most r ranks,
  ``min over bags B containing X's lowest sequence, sizes c of max(bag(B, c), best[X - B][r - c])``
  (non-increasing in r, which prunes: a bag no faster than ``best[X][c]`` cannot improve);
* ``opt[X] = min over micro-batches Y containing X's lowest sequence of best[Y][N] + opt[X - Y]``.

Only problems with one pipeline stage and VPP group size 1 are accepted (the count rules are a
separate constraint the oracle does not model).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from megatron.varlen.scheduling.cost_model import CostModel
from megatron.varlen.scheduling.problem import Schedule, ScheduleProblem, padded_length

MAX_SEQUENCES = 12
MAX_RANKS = 16


@dataclass(frozen=True)
class OracleResult:
    """The optimum and one schedule reaching it."""

    critical_path: float
    schedule: Schedule


def _bag_times(problem: ScheduleProblem, sizes: tuple[int, ...]) -> dict[int, list[float]]:
    """For each size c, per subset mask: the bag's per-rank time incl. latency (inf if over
    the token budget)."""
    num, cost, budget = problem.num_sequences, problem.cost, problem.max_seqlen_per_rank
    out = {}
    for size in sizes:
        padded = [padded_length(length, size, problem.sp_factor) for length in problem.lengths]
        times = [cost.time(value, size) for value in padded]
        tokens = [value // size for value in padded]
        bag_time, bag_tokens = [0.0] * (1 << num), [0] * (1 << num)
        for mask in range(1, 1 << num):
            low = (mask & -mask).bit_length() - 1
            bag_time[mask] = bag_time[mask & (mask - 1)] + times[low]
            bag_tokens[mask] = bag_tokens[mask & (mask - 1)] + tokens[low]
        latency = cost.group_latency(size)
        out[size] = [time + latency if tok <= budget else math.inf
                     for time, tok in zip(bag_time, bag_tokens)]
    return out


def _microbatch_levels(problem: ScheduleProblem, sizes: tuple[int, ...],
                       bags: dict[int, list[float]]) -> tuple[list[list[float]], list[list]]:
    """best[X][r] and the (bag, size) choice behind each entry (see module docstring)."""
    num_ranks, full = problem.num_ranks, 1 << problem.num_sequences
    best = [[0.0] * (num_ranks + 1)] + [None] * (full - 1)
    choice: list[list] = [[None] * (num_ranks + 1) for _ in range(full)]
    for mask in range(1, full):
        low = mask & -mask
        rest = mask ^ low
        current = [math.inf] * (num_ranks + 1)
        pick = choice[mask]
        sub = rest
        while True:
            bag = sub | low
            remaining = best[mask ^ bag]
            for size in sizes:
                bag_time = bags[size][bag]
                if size > num_ranks or bag_time >= current[size]:
                    continue  # current is non-increasing: no entry r >= size can improve
                for ranks in range(size, num_ranks + 1):
                    value = max(bag_time, remaining[ranks - size])
                    if value < current[ranks]:
                        current[ranks] = value
                        pick[ranks] = (bag, size)
            if sub == 0:
                break
            sub = (sub - 1) & rest
        best[mask] = current
    return best, choice


def _bags_of(mask: int, ranks: int, choice: list[list]) -> list[tuple[int, int]]:
    """The (bag mask, size) list behind best[mask][ranks]."""
    bags = []
    while mask:
        bag, size = choice[mask][ranks]
        bags.append((bag, size))
        mask ^= bag
        ranks -= size
    return bags


def _to_schedule(problem: ScheduleProblem,
                 microbatches: list[list[tuple[int, int]]]) -> Schedule:
    """Lays each micro-batch's bags out largest first from rank 0 (aligned on a chain)."""
    cp_sizes = [0] * problem.num_sequences
    layout = []
    for bags in microbatches:
        ranks: list[tuple[int, ...]] = [()] * problem.num_ranks
        start = 0
        for bag, size in sorted(bags, key=lambda item: -item[1]):
            ids = tuple(seq for seq in range(problem.num_sequences) if bag >> seq & 1)
            for seq in ids:
                cp_sizes[seq] = size
            ranks[start:start + size] = [ids] * size
            start += size
        layout.append(tuple(ranks))
    padded = tuple(padded_length(length, size, problem.sp_factor)
                   for length, size in zip(problem.lengths, cp_sizes))
    return Schedule(microbatches=tuple(layout), cp_sizes=tuple(cp_sizes), padded_lengths=padded)


def solve_exactly(problem: ScheduleProblem) -> OracleResult:
    """The minimum critical path of ``problem`` and a schedule reaching it.

    Raises:
        ValueError: if the problem is too large for exhaustive search or has pipeline/VPP
            micro-batch count rules.
    """
    num = problem.num_sequences
    if num > MAX_SEQUENCES or problem.num_ranks > MAX_RANKS:
        raise ValueError(f"oracle handles at most {MAX_SEQUENCES} sequences and {MAX_RANKS} "
                         f"ranks, got {num} and {problem.num_ranks}")
    if problem.min_num_microbatches != 1 or problem.vpp_group_size != 1:
        raise ValueError("oracle handles min_num_microbatches = vpp_group_size = 1 only")
    if num == 0:
        return OracleResult(0.0, Schedule(microbatches=(), cp_sizes=(), padded_lengths=()))
    sizes = problem.layout.sequence_sizes
    bags = _bag_times(problem, sizes)
    best, choice = _microbatch_levels(problem, sizes, bags)
    full, num_ranks = (1 << num) - 1, problem.num_ranks
    opt, split = [0.0] * (full + 1), [0] * (full + 1)
    for mask in range(1, full + 1):
        low = mask & -mask
        rest = mask ^ low
        value, pick, sub = math.inf, 0, rest
        while True:
            part = sub | low
            candidate = best[part][num_ranks] + opt[mask ^ part]
            if candidate < value:
                value, pick = candidate, part
            if sub == 0:
                break
            sub = (sub - 1) & rest
        opt[mask], split[mask] = value, pick
    microbatches, mask = [], full
    while mask:
        part = split[mask]
        microbatches.append(_bags_of(part, num_ranks, choice))
        mask ^= part
    return OracleResult(opt[full], _to_schedule(problem, microbatches))


# --- Generated tiny instances per cost regime (for the oracle tests and the benchmark) ---------

# The reference cost (a 1024-hidden dense decoder: b = 6h, docs/SCHEDULING.md) and variants.
REFERENCE_COST = CostModel(a=1.0, b=6144.0, g=1600.0, d=2e6)
LONG_CONTEXT_SCALE = 32  # lengths 32x longer = b and g / 32, d / 32^2 at the same lengths
REGIMES = {
    "default": REFERENCE_COST,
    "long_context": CostModel(a=1.0, b=REFERENCE_COST.b / LONG_CONTEXT_SCALE,
                              g=REFERENCE_COST.g / LONG_CONTEXT_SCALE,
                              d=REFERENCE_COST.d / LONG_CONTEXT_SCALE ** 2),
    "attention_only": CostModel(a=1.0, b=0.0, g=0.0, d=0.0),
    "communication_heavy": CostModel(a=1.0, b=6144.0, g=20000.0, d=2e7),
    "mixed": None,  # a random mix per instance, see _mixed_cost
}
# (dp, cp) splits of 2-8 ranks; 6 ranks has the chains 1|2|6 and 1|3|6.
RANK_SPLITS = ((2, 1), (1, 2), (4, 1), (2, 2), (6, 1), (3, 2), (2, 3), (8, 1), (4, 2), (2, 4))
BUDGETS = (64, 128, 256, 512)
MIN_SEQUENCES, MAX_GENERATED_SEQUENCES = 3, 9


def _mixed_cost(rng: random.Random) -> CostModel:
    """Each coefficient scaled by a log-uniform factor in [1/32, 32] around the reference."""
    def scaled(value: float) -> float:
        return value * 2.0 ** rng.uniform(-5.0, 5.0)
    return CostModel(a=1.0, b=scaled(REFERENCE_COST.b), g=scaled(REFERENCE_COST.g),
                     d=scaled(REFERENCE_COST.d))


def _longest_allowed(num_ranks: int, budget: int) -> int:
    """Longest length whose padding on all ranks fits the budget (sp = 1)."""
    return budget if num_ranks == 1 else 2 * num_ranks * (budget // 2)


def generate_instance(regime: str, rng: random.Random) -> ScheduleProblem:
    """One random tiny problem of ``regime`` (a key of REGIMES): 2-8 ranks, 3-9 sequences with
    log-uniform lengths up to what fits on all ranks, sometimes a minimum CP size."""
    dp_size, cp_size = rng.choice(RANK_SPLITS)
    num_ranks = dp_size * cp_size
    budget = rng.choice(BUDGETS)
    longest = _longest_allowed(num_ranks, budget)
    lengths = tuple(max(1, min(longest, int(round(longest ** rng.random()))))
                    for _ in range(rng.randint(MIN_SEQUENCES, MAX_GENERATED_SEQUENCES)))
    min_cp = 1 if rng.random() < 0.75 else rng.choice([2, 4])
    cost = REGIMES[regime] or _mixed_cost(rng)
    return ScheduleProblem(lengths=lengths, dp_size=dp_size, cp_size=cp_size,
                           max_seqlen_per_rank=budget, min_cp_size=min(min_cp, num_ranks),
                           cost=cost)


def generate_instances(regime: str, count: int, seed: int) -> list[ScheduleProblem]:
    """``count`` reproducible instances of ``regime``."""
    rng = random.Random(f"{regime}/{seed}")
    return [generate_instance(regime, rng) for _ in range(count)]
