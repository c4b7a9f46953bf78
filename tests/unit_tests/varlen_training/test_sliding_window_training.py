"""Training with a sliding window (``--window-size 5,0 --window-attn-skip-freq 2``: layers 1
and 3 windowed, 2 and 4 full; the hybrid's one attention layer by a per-layer list) gives the same losses and grad norms on every layout: packed,
dynamically CP-split over 2 ranks (local and flash attention), and a hybrid Mamba model packed,
each against the plain unpacked single-rank run with the same flags (3 steps, float32
rounding). The window is narrower than most samples, so it changes the model: the unpacked
run without it has other losses (the comparison can fail). The attention math itself is
checked against a float64 windowed softmax in tests/unit_tests/varlen/attention/
test_sliding_window.py.
"""

import pytest

from tests.harness.training_runs import assert_same_history
from tools.probe_combinations import launch

RTOL = 1e-5
WINDOW = ("--window-size", "5,0", "--window-attn-skip-freq", "2")
# The hybrid pattern M*M- has one attention layer, layer 2: a per-layer list windows it.
HYBRID_WINDOW = ("--window-size", "5,0", "--window-attn-skip-freq", "[0,1,0,0]")
FLASH = ("--attention-backend", "flash")
# name: (feature, layout, extra flags)
RUNS = {
    "dense unpacked": ("dense", "u_single", WINDOW),
    "dense packed": ("dense", "p_single", WINDOW),
    "dense dynamic cp": ("dense", "d_cp2", WINDOW),
    "dense dynamic cp flash": ("dense", "d_cp2", WINDOW + FLASH),
    "dense unpacked, no window": ("dense", "u_single", ()),
    "hybrid unpacked": ("hybrid", "u_single", HYBRID_WINDOW),
    "hybrid packed": ("hybrid", "p_single", HYBRID_WINDOW),
    "hybrid unpacked, no window": ("hybrid", "u_single", ()),
}


@pytest.fixture(scope="module")
def runs() -> dict:
    results = {name: launch(feature, layout, "none", extra)
               for name, (feature, layout, extra) in RUNS.items()}
    for name, result in results.items():
        assert result["status"] == "ran", (name, result.get("reason"), result.get("error"))
    return {name: result["history"] for name, result in results.items()}


@pytest.mark.parametrize("name", ["dense packed", "dense dynamic cp", "dense dynamic cp flash"])
def test_dense_layouts_equal_the_unpacked_run(runs, name):
    assert len(runs[name]) == 3
    assert_same_history(runs[name], runs["dense unpacked"], RTOL, name)


def test_hybrid_packed_equals_unpacked(runs):
    assert_same_history(runs["hybrid packed"], runs["hybrid unpacked"], RTOL, "hybrid packed")


@pytest.mark.parametrize("feature", ["dense", "hybrid"])
def test_the_window_changes_the_model(runs, feature):
    windowed = [step["lm_loss"] for step in runs[f"{feature} unpacked"]]
    full = [step["lm_loss"] for step in runs[f"{feature} unpacked, no window"]]
    assert windowed != pytest.approx(full, rel=1e-4)
