"""How much causal attention one sequence does, in the "squared tokens" that model FLOPs and the
packing scheduler's cost model count.

Full causal attention over L tokens counts L^2: twice the area of the lower triangle (its
L(L+1)/2 query-key pairs are L^2/2 + L/2, so L^2 = 2*pairs - L). A causal sliding window of
LEFT = w earlier keys (query i sees keys max(0, i - w) .. i) cuts the (L - m)^2 corner off
that triangle, m = min(L, w + 1): m*(2L - m) = L^2 - (L - m)^2. That is L^2 while L <= w + 1
and 2(w + 1)L - (w + 1)^2, linear in L, beyond; in pairs, m*(2L - m) = 2*pairs - m, where
pairs = sum over i of min(i, w) + 1 (tests count them from a mask).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy


def attention_area(length, window: int | None = None):
    """Squared tokens of causal attention over ``length`` tokens (an int, exact, or a numpy
    array), through a left window of ``window`` earlier keys (None: unbounded: length^2)."""
    if window is None:
        return length * length
    span = numpy.minimum(length, window + 1) if isinstance(length, numpy.ndarray) \
        else min(length, window + 1)
    return span * (2 * length - span)


def length_sums(lengths: Iterable[int], window: int | None = None
                ) -> tuple[int, int, int | None]:
    """Exact ``(sum L, sum L^2, sum of windowed squared tokens)`` of sequences of ``lengths``;
    the third is None without a window (nothing attends through one)."""
    lengths = [int(n) for n in lengths]
    windowed = None if window is None else sum(attention_area(n, window) for n in lengths)
    return sum(lengths), sum(n * n for n in lengths), windowed
