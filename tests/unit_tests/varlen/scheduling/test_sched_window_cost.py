"""The cost model under a sliding window: the windowed layers' share ``a_window`` prices
m*(2P - m) squared tokens, m = min(P, window + 1), where the rest price P^2.

References: the query-key pairs a window mask allows, counted by brute force (squared tokens =
2*pairs - m); ``longest_fitting`` against ``time`` itself (the largest fitting length and
just beyond it); the schedulers' own validator on windowed problems.
"""

import random

import numpy as np
import pytest

from megatron.varlen.scheduling import CostModel, ScheduleProblem, get_scheduler
from megatron.varlen.scheduling import validate_schedule

WINDOW = 37
COST = CostModel(a=0.25, b=300.0, g=40.0, d=5.0, a_window=0.75, window=WINDOW)


def _squared_tokens(length: int, window: int) -> int:
    query, key = np.arange(length)[:, None], np.arange(length)[None, :]
    pairs = int(((key <= query) & (key >= query - window)).sum())
    return 2 * pairs - min(length, window + 1)


@pytest.mark.parametrize("cp_size", [1, 2, 4])
def test_time_prices_the_window_mask_pairs(cp_size):
    lengths = [1, 2, 30, 37, 38, 39, 76, 200, 515]
    for length in lengths:
        expected = ((0.25 * length ** 2 + 0.75 * _squared_tokens(length, WINDOW) + 300 * length)
                    / cp_size + 40.0 * length * (cp_size - 1) / cp_size)
        assert COST.time(length, cp_size) == pytest.approx(expected, rel=1e-12)
    as_array = COST.time(np.array(lengths), cp_size)
    assert as_array.tolist() == pytest.approx([COST.time(n, cp_size) for n in lengths],
                                              rel=1e-12)


@pytest.mark.parametrize("cost", [
    COST,
    CostModel(a=0.0, b=300.0, g=40.0, d=5.0, a_window=1.0, window=WINDOW),  # every layer
    CostModel(a=1.0, b=300.0, g=40.0, d=5.0, a_window=0.0),                # no window
])
@pytest.mark.parametrize("cp_size", [1, 3])
def test_longest_fitting_inverts_time_on_both_sides_of_the_window(cost, cp_size):
    for length in (1.0, 20.0, 38.0, 39.5, 120.0, 5000.0):
        room = cost.time(length, cp_size)
        longest = cost.longest_fitting(room, token_room=10 ** 9, cp_size=cp_size)
        assert longest == pytest.approx(length, rel=1e-9)
        assert cost.time(longest * (1 + 1e-6), cp_size) > room
    assert cost.longest_fitting(cost.time(900, 2), token_room=100, cp_size=2) == 200


def test_a_window_needs_a_window():
    with pytest.raises(ValueError, match="window=None"):
        CostModel(a_window=0.5)
    assert "window" not in CostModel().as_dict()
    assert COST.as_dict()["window"] == WINDOW


@pytest.mark.parametrize("name", ["dp_balanced", "default_dynamic_cp"])
def test_windowed_problems_get_valid_schedules(name):
    rng = random.Random(3)
    for _ in range(10):
        lengths = tuple(rng.randint(1, 2048) for _ in range(rng.randint(1, 60)))
        problem = ScheduleProblem(lengths=lengths, dp_size=2, cp_size=2,
                                  max_seqlen_per_rank=1024,
                                  cost=CostModel(a_window=0.5, a=0.5, window=127))
        validate_schedule(problem, get_scheduler(name)(problem))
