"""The micro-batch price bound: a per-micro-batch (configuration-LP dual) lower bound on the
critical path (derivation and proof in docs/SCHEDULING.md, "Micro-batch price bound").

Give every sequence a price ``y_i >= 0``. Cut the levels into stretches ``[G_a, R_a)``. In a
micro-batch of level ``T`` in stretch ``a`` a sequence runs on an allowed size ``c`` with
``t_i(c) + d (c-1) <= T < R_a``, and a group of size ``c`` fills each of its ranks with at most
``T - d (c-1)`` of time and ``M`` tokens. So for any weights ``theta_c`` in [0, 1] the rank
shares

    r_i(c) = theta_c c t_i(c) / cap_a(c) + (1 - theta_c) P_i(c) / M,
    cap_a(c) = G_a (1 - d (c-1) / R_a),

times ``G_a / T``, sum to at most N over the micro-batch, and the price it holds is at most
``T / G_a`` times ``U_a``, the fractional knapsack of the prices with weights ``min_c r_i(c)``
and capacity N. Every micro-batch thus holds at most ``lambda T`` of price, ``lambda = max_a
U_a / G_a``, so every schedule has ``C >= sum_i y_i / lambda``.

Validity never depends on how ``y`` and ``theta`` were chosen, only on ``lambda`` covering
every stretch: the prices come from a deterministic heuristic (each sequence's least
latency-charged work over the sizes that meet a level cap, the best cap of a search, then a
multiplicative ascent on log(sum y / lambda)) and ``theta`` from a short coordinate search on
the stretches that set ``lambda``. With the best theta, U_a is the value of the LP over
fractional micro-batches with n_c ranks per size (its dual is this knapsack over theta).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from megatron.varlen.scheduling.problem import ScheduleProblem
from tools.scheduling.bound_prices import price_table

# The bound is skipped (0) on batches that need more than MAX_TOKEN_MICROBATCHES micro-batches
# by tokens alone or have more than MAX_DISTINCT_LENGTHS distinct lengths: it bites where a few
# micro-batches hold everything (small global batches; with many micro-batches the pooled
# bounds are as good) and its cost grows as distinct lengths x stretches.
MAX_TOKEN_MICROBATCHES = 8
MAX_DISTINCT_LENGTHS = 1024
MAX_STRETCHES = 256  # more breakpoints are merged into coarser stretches (still valid)
UNIFORM_THETAS = (0.0, 0.5, 1.0)  # theta_c tried alike for every size, on every stretch
REFINED_THETAS = np.linspace(0.0, 1.0, 6)  # per-size coordinate search values
REFINED_BATCH = 4  # stretches searched at a time (largest ratio first)
MAX_REFINED_BATCHES = 4
COARSE_PRICE_CAPS = 5  # level caps tried first for the prices, then a local search
ASCENT_STEPS = 40  # then multiplicative steps on the prices (log-gradient of sum y / lambda)
ASCENT_RATE = 0.02  # largest change of a log price in the first step (decays linearly)
SOFTMAX_WIDTH = 3e-4  # stretches within about this relative gap of lambda share the gradient
THETA_REFRESH = 10  # steps between theta searches (theta is held fixed in between)


@dataclass(frozen=True)
class LengthOptions:
    """Every (distinct length, allowed size) pair, sorted by length group: group, size index,
    size c, per-rank time t, padded tokens P, least level e = t + d (c - 1)."""

    group: np.ndarray
    size_index: np.ndarray
    size: np.ndarray
    time: np.ndarray
    tokens: np.ndarray
    level: np.ndarray
    multiplicity: np.ndarray  # sequences per length group
    latency: np.ndarray  # per size index: d (c - 1)
    num_ranks: int
    budget: int


def length_options(problem: ScheduleProblem) -> LengthOptions:
    """The options of the distinct lengths (equal lengths have equal options)."""
    table = price_table(problem)
    lengths = np.asarray(problem.lengths, dtype=np.int64)
    _, first, counts = np.unique(lengths, return_index=True, return_counts=True)
    time = table.time[first]
    group, size_index = np.nonzero(np.isfinite(time))  # row-major: sorted by group
    latency = problem.cost.group_latency(table.sizes).astype(np.float64)
    option_time = time[group, size_index]
    return LengthOptions(group=group, size_index=size_index,
                    size=table.sizes[size_index].astype(np.float64), time=option_time,
                    tokens=table.tokens[first][group, size_index].astype(np.float64),
                    level=option_time + latency[size_index],
                    multiplicity=counts.astype(np.float64), latency=latency,
                    num_ranks=problem.num_ranks, budget=problem.max_seqlen_per_rank)


def _stretch_starts(options: LengthOptions) -> np.ndarray:
    """Left ends G_a: every breakpoint (distinct least level), or at most MAX_STRETCHES of them
    (the largest quarter kept, the rest evenly spread). Merging is valid: a stretch allows every
    option whose least level lies below its right end."""
    levels = np.unique(options.level)
    if len(levels) <= MAX_STRETCHES:
        return levels
    keep = MAX_STRETCHES // 4
    spread = np.linspace(0, len(levels) - keep - 1, MAX_STRETCHES - keep).astype(np.int64)
    return np.unique(np.concatenate([levels[spread], levels[-keep:]]))


def _group_min(values: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Row-wise min over the columns of each group (columns sorted by group)."""
    starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    return np.minimum.reduceat(values, starts, axis=1)


class Stretches:
    """Stretches [starts[a], ends[a]) and the two parts of every option's rank share there."""

    def __init__(self, options: LengthOptions, starts: np.ndarray, ends: np.ndarray):
        self.options, self.starts, self.ends = options, starts, ends
        self.allowed = options.level[None, :] < ends[:, None]
        room = 1.0 - options.latency[options.size_index][None, :] / ends[:, None]
        capacity = np.where(self.allowed, starts[:, None] * room, 1.0)  # cap_a(c) > t there
        self.time_share = options.size * options.time / capacity
        self.token_share = np.broadcast_to(options.tokens / options.budget,
                                           self.allowed.shape)

    def ratios(self, prices: np.ndarray, theta: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """U_a / G_a for the stretches ``rows`` with weights theta (rows x sizes)."""
        return self.ratios_and_takes(prices, theta, rows)[0]

    def ratios_and_takes(self, prices: np.ndarray, theta: np.ndarray,
                         rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``ratios`` and the knapsacks' takes zeta (rows x length groups)."""
        weight = theta[:, self.options.size_index]
        share = weight * self.time_share[rows] + (1.0 - weight) * self.token_share[rows]
        share = _group_min(np.where(self.allowed[rows], share, np.inf), self.options.group)
        held, zeta = _knapsack(prices, self.options.multiplicity, share,
                               self.options.num_ranks)
        return held / self.starts[rows], zeta


def _knapsack(prices: np.ndarray, multiplicity: np.ndarray, shares: np.ndarray,
              capacity: float) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``shares``: max sum prices * zeta over 0 <= zeta <= multiplicity with
    sum shares * zeta <= capacity (fractional knapsack: best price per share first; an
    infinite share is an item that may not be taken). Returns (values, zeta)."""
    allowed = np.isfinite(shares)
    ratio = np.where(allowed, prices / np.where(allowed, shares, 1.0), 0.0)
    order = np.argsort(-ratio, axis=1, kind="stable")
    ratio = np.take_along_axis(ratio, order, 1)
    sorted_shares = np.take_along_axis(np.where(allowed, shares, np.inf), order, 1)
    weight = sorted_shares * multiplicity[order]
    value = np.take_along_axis(np.where(allowed, prices * multiplicity, 0.0), order, 1)
    used = np.concatenate([np.zeros((len(shares), 1)), np.cumsum(weight, axis=1)], axis=1)
    gained = np.concatenate([np.zeros((len(shares), 1)), np.cumsum(value, axis=1)], axis=1)
    whole = (used[:, 1:] <= capacity).sum(axis=1)  # items taken whole (a prefix)
    rows = np.arange(len(shares))
    spare = capacity - used[rows, whole]
    last = np.minimum(whole, shares.shape[1] - 1)
    partial = whole < shares.shape[1]
    next_ratio = np.where(partial, ratio[rows, last], 0.0)
    take = np.where(np.arange(shares.shape[1])[None, :] < whole[:, None], multiplicity[order],
                    0.0)
    fraction = np.where(partial & (next_ratio > 0.0), spare / sorted_shares[rows, last], 0.0)
    take[rows, last] += np.where(partial, fraction, 0.0)
    zeta = np.empty_like(take)
    np.put_along_axis(zeta, order, take, 1)
    return gained[rows, whole] + spare * next_ratio, zeta


def _best_theta(stretches: Stretches, prices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per stretch, the least U_a / G_a found over theta: UNIFORM_THETAS for every stretch,
    then a per-size coordinate search on the stretch with the largest ratio, repeated (in
    batches of REFINED_BATCH) until the largest ratio belongs to a searched stretch. Each value
    is a valid upper bound of its stretch's ratio, whatever theta it came from."""
    num, num_sizes = len(stretches.starts), len(stretches.options.latency)
    best_theta = np.zeros((num, num_sizes))
    best = np.full(num, np.inf)
    for value in UNIFORM_THETAS:
        ratio = stretches.ratios(prices, np.full((num, num_sizes), value), np.arange(num))
        better = ratio < best
        best[better], best_theta[better] = ratio[better], value
    searched = np.zeros(num, dtype=bool)
    for _ in range(MAX_REFINED_BATCHES):
        order = np.argsort(-best, kind="stable")
        if searched[order[0]]:
            break
        rows = order[~searched[order]][:REFINED_BATCH]
        searched[rows] = True
        for size in range(num_sizes):
            for value in REFINED_THETAS:
                theta = best_theta[rows].copy()
                theta[:, size] = value
                ratio = stretches.ratios(prices, theta, rows)
                better = ratio < best[rows]
                best[rows[better]] = ratio[better]
                best_theta[rows[better]] = theta[better]
    return best, best_theta


def price_ratio(options: LengthOptions, prices: np.ndarray) -> float:
    """lambda: an upper bound on price held / level over every micro-batch of every schedule.

    Stretches [G_a, G_{a+1}) for every breakpoint G_a; the last one ends at R = sum y /
    lambda_inner (above it every micro-batch holds at most sum y <= lambda_inner T) or, if
    that is not above its start, at infinity (latency dropped there: still valid)."""
    starts = _stretch_starts(options)
    ends = np.append(starts[1:], np.inf)
    inner = _best_theta(Stretches(options, starts, ends), prices)[0]
    total = float(prices @ options.multiplicity)
    lam_inner = float(inner[:-1].max()) if len(inner) > 1 else 0.0
    if lam_inner > 0.0 and total / lam_inner > starts[-1]:
        last = Stretches(options, starts[-1:], np.array([total / lam_inner]))
        inner[-1] = min(inner[-1], _best_theta(last, prices)[0][0])
    return float(inner.max())


def _capped_prices(options: LengthOptions, cap: float) -> np.ndarray:
    """Each length's least latency-charged work / N over its sizes with least level <= cap
    (all sizes if none meets it)."""
    work = options.size * options.time + options.tokens * options.latency[
        options.size_index] / options.budget
    meets = options.level <= cap
    group_meets = _group_min(np.where(meets, 0.0, 1.0)[None, :], options.group)[0] == 0.0
    usable = meets | ~group_meets[options.group]
    return _group_min(np.where(usable, work, np.inf)[None, :], options.group)[0] / \
        options.num_ranks


def _price_caps(options: LengthOptions) -> np.ndarray:
    """Candidate level caps: the breakpoints from the slowest length's least level up (below
    it some length meets no cap); the capped prices only change there."""
    slowest = _group_min(options.level[None, :], options.group)[0].max()
    return np.unique(options.level[options.level >= slowest])


def applies(problem: ScheduleProblem) -> bool:
    """Whether the batch is small enough for the bound (see MAX_TOKEN_MICROBATCHES)."""
    if not problem.lengths or len(set(problem.lengths)) > MAX_DISTINCT_LENGTHS:
        return False
    least_tokens = float(price_table(problem).tokens.min(axis=1).sum())  # every size fits N
    capacity = problem.num_ranks * problem.max_seqlen_per_rank
    return least_tokens <= MAX_TOKEN_MICROBATCHES * capacity


def _bound(options: LengthOptions, prices: np.ndarray) -> float:
    """sum y / lambda: valid for any prices."""
    return float(prices @ options.multiplicity) / price_ratio(options, prices)


def _ascend(options: LengthOptions, prices: np.ndarray) -> tuple[float, np.ndarray]:
    """Multiplicative ascent of log(sum y / lambda): a length's log price grows with its share
    of the total price and shrinks with its share of what the stretches that set lambda hold
    (soft-max weights). Each step's sum y / lambda (theta held, last stretch to infinity) is a
    valid bound; returns the best and its prices."""
    starts = _stretch_starts(options)
    stretches = Stretches(options, starts, np.append(starts[1:], np.inf))
    every = np.arange(len(starts))
    best_value, best_prices = 0.0, prices
    for step in range(ASCENT_STEPS):
        if step % THETA_REFRESH == 0:
            theta = _best_theta(stretches, prices)[1]
        ratio, zeta = stretches.ratios_and_takes(prices, theta, every)
        lam, total = float(ratio.max()), float(prices @ options.multiplicity)
        if total / lam > best_value:
            best_value, best_prices = total / lam, prices
        weight = np.exp((ratio - lam) / (SOFTMAX_WIDTH * lam))
        held = ratio * starts
        knapsack_share = zeta * prices / np.where(held > 0.0, held, 1.0)[:, None]
        gradient = prices * options.multiplicity / total - weight @ knapsack_share / weight.sum()
        scale = float(np.abs(gradient).max())
        if scale == 0.0:
            break
        prices = prices * np.exp(ASCENT_RATE * (1.0 - step / ASCENT_STEPS) * gradient / scale)
    return best_value, best_prices


def microbatch_price_bound(problem: ScheduleProblem) -> float:
    """sum y / lambda for the capped prices of the best level cap found (a coarse scan of the
    candidate caps, then a local search with halving steps; 0 where ``applies`` is False).
    Any cap gives a valid bound."""
    if not applies(problem):
        return 0.0
    options = length_options(problem)
    caps = _price_caps(options)
    values: dict[int, float] = {}

    def value(index: int) -> float:
        if index not in values:
            values[index] = _bound(options, _capped_prices(options, float(caps[index])))
        return values[index]

    coarse = np.unique(np.linspace(0, len(caps) - 1, COARSE_PRICE_CAPS).astype(np.int64))
    best = max(coarse.tolist(), key=value)
    step = max(1, len(caps) // (2 * COARSE_PRICE_CAPS))
    while step >= 1:
        moved = max((index for index in (best - step, best + step) if 0 <= index < len(caps)),
                    key=value, default=best)
        if value(moved) > value(best):
            best = moved
        else:
            step //= 2
    ascended, prices = _ascend(options, _capped_prices(options, float(caps[best])))
    return max(value(best), ascended, _bound(options, prices))
