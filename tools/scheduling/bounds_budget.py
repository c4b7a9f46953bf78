"""The budget-aware lower bound (derivation in docs/SCHEDULING.md, "Bounds").

Notation: N ranks, budget M tokens per rank, for sequence i and allowed size c: tokens
tok_i(c) (padded), per-rank time t_i(c), work w_i(c) = c * t_i(c); tok_i, w_i, t_i without c are
minima over c. Fix any threshold theta and any schedule with micro-batch levels T_k (C = sum T_k).
Let K be the micro-batches with T_k > theta, |K| = K, A = sum over K of T_k. Then:

* a sequence outside K runs with t_i(c) <= theta, so costs at least w_i^theta = min{w_i(c) :
  t_i(c) <= theta} (infinite if no c reaches theta: such "mandatory" sequences I lie in K);
* outside K the levels are at least work / N, hence C >= A + (sum of w^theta outside K) / N;
* K holds at most N*M*K tokens, so K >= ceil(tok(I) / (N M)) and the optional sequences inside K
  take at most N*M*K - tok(I) tokens; it holds at most N*A work, of which the mandatory
  sequences (each level <= x = A - (K-1)*theta) need sum_I min{w_i(c): t_i(c) <= x};
* every level in K exceeds theta and one holds max_I t_i, so A >= max_I t_i + (K-1)*theta.

The w^theta value of the optional sequences inside K is at most the smaller of two fractional
knapsacks (tokens, and minimum work), so

    C >= min over K, A of  A + (W^theta - min(V_tok(N M K - tok(I)), V_work(N A - w_I(x)))) / N

where W^theta sums w^theta over optional sequences. The bracket is non-increasing in A until the
work knapsack reaches the token knapsack and rises after, so the minimum over A is found by a
bisection (taking the bracket's lower end keeps the result a valid lower bound). The bound is
the maximum over a grid of theta values; any theta gives a valid bound.
"""

from __future__ import annotations

import numpy as np

NUM_THETA_QUANTILES = 32
NUM_TOP_THRESHOLDS = 32
JUST_BELOW = 1e-9
BISECTION_STEPS = 40  # relative width 1e-12; a_lo stays a lower end at any step count
RELATIVE_TOLERANCE = 1e-9


def _knapsack_curve(values: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fractional knapsack: (cumulative weight, cumulative value), best ratio first."""
    ratio = values / np.maximum(weights, 1e-300)
    order = np.argsort(-ratio, kind="stable")
    return (np.concatenate(([0.0], np.cumsum(weights[order]))),
            np.concatenate(([0.0], np.cumsum(values[order]))))


def _mandatory_work_steps(time: np.ndarray, work: np.ndarray,
                          start: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Step function x -> sum_i min{work[i,c] : time[i,c] <= x} for x >= start.

    Returns (event x values ascending, cumulative change after 0..E events, value at start).
    Every row must have an option with time <= start."""
    by_time = np.argsort(time, axis=1, kind="stable")
    time_sorted = np.take_along_axis(time, by_time, axis=1)
    running = np.minimum.accumulate(np.take_along_axis(work, by_time, axis=1), axis=1)
    last_ready = (time_sorted <= start).sum(axis=1) - 1
    base = running[np.arange(len(time)), last_ready].sum()
    later = (time_sorted > start) & np.isfinite(time_sorted)
    later[:, 0] = False
    deltas = (running[:, 1:] - running[:, :-1])[later[:, 1:]]
    event_x = time_sorted[:, 1:][later[:, 1:]]
    order = np.argsort(event_x, kind="stable")
    return event_x[order], np.concatenate(([0.0], np.cumsum(deltas[order]))), float(base)


def _theta_bound(tokens: np.ndarray, time: np.ndarray, work: np.ndarray, theta: float,
                 num_ranks: int, budget: int) -> float:
    """min over K, A of the bracket above for one theta."""
    work_theta = np.where(time <= theta, work, np.inf).min(axis=1)
    mandatory = ~np.isfinite(work_theta)
    optional = ~mandatory
    tok_min = tokens.min(axis=1).astype(np.float64)
    w_theta_total = work_theta[optional].sum()
    tok_curve = _knapsack_curve(work_theta[optional], tok_min[optional])
    work_curve = _knapsack_curve(work_theta[optional], work.min(axis=1)[optional])
    capacity = float(num_ranks) * budget
    tok_mandatory = tok_min[mandatory].sum()
    if mandatory.any():
        t_top = time[mandatory].min(axis=1).max()
        steps = _mandatory_work_steps(time[mandatory], work[mandatory], t_top)
        k_min = max(1, int(np.ceil(tok_mandatory / capacity)))
    else:  # K = 0 allowed: every micro-batch at most theta
        t_top, steps, k_min = theta, (np.zeros(0), np.zeros(1), 0.0), 0
    k_max = max(k_min, int(np.ceil((tok_mandatory + tok_curve[0][-1]) / capacity)))
    k_values = np.arange(k_min, k_max + 1, dtype=np.float64)
    token_value = np.interp(capacity * k_values - tok_mandatory, *tok_curve)
    a_lo = np.maximum(t_top + (k_values - 1.0) * theta, 0.0)
    a_hi = a_lo + (work_curve[0][-1] + steps[2]) / num_ranks + 1.0
    # Both knapsacks saturate at the same total summed in different orders: compare with a
    # relative tolerance (it can only lower A, so the bound stays valid).
    target = token_value * (1.0 - RELATIVE_TOLERANCE)
    for _ in range(BISECTION_STEPS):
        middle = 0.5 * (a_lo + a_hi)
        reached = _work_value(middle, k_values, theta, steps, work_curve, num_ranks) >= target
        a_hi = np.where(reached, middle, a_hi)
        a_lo = np.where(reached, a_lo, middle)
    # a_lo <= A*, so a_lo + (W - V_tok)/N <= the minimum over A: a valid lower bound.
    return float(np.min(a_lo + (w_theta_total - token_value) / num_ranks))


def _work_value(area: np.ndarray, k_values: np.ndarray, theta: float,
                steps: tuple[np.ndarray, np.ndarray, float], work_curve: tuple,
                num_ranks: int) -> np.ndarray:
    """V_work(N*A - w_I(A - (K-1)*theta)) for arrays A, K."""
    event_x, cumulative, base = steps
    level = area - (k_values - 1.0) * theta
    index = np.searchsorted(event_x, level, side="right")
    mandatory_work = base + cumulative[index]
    return np.interp(num_ranks * area - mandatory_work, *work_curve)


def _theta_grid(time: np.ndarray) -> np.ndarray:
    """Thresholds to try: quantiles of every price, quantiles of each sequence's fastest time,
    and just below the largest fastest times (where the mandatory set changes for the long
    sequences, which is where the bound bites)."""
    finite = time[np.isfinite(time)]
    fastest = np.unique(time.min(axis=1))
    candidates = [np.quantile(finite, np.linspace(0.0, 1.0, NUM_THETA_QUANTILES)),
                  np.quantile(fastest, np.linspace(0.0, 1.0, NUM_THETA_QUANTILES)),
                  fastest[-NUM_TOP_THRESHOLDS:] * (1.0 - JUST_BELOW)]
    return np.unique(np.concatenate(candidates))


def budget_aware_bound(tokens: np.ndarray, time: np.ndarray, work: np.ndarray,
                       num_ranks: int, budget: int) -> float:
    """Max over a theta grid of the per-theta bound; arrays are sequences x sizes."""
    grid = _theta_grid(time)
    best = 0.0
    for theta in grid.tolist():
        best = max(best, _theta_bound(tokens, time, work, theta, num_ranks, budget))
    return best
