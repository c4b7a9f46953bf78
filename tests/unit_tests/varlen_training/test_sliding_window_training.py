"""Training with a sliding window (``--window-size 5,0 --window-attn-skip-freq 2``: layers 1
and 3 windowed, 2 and 4 full; the hybrid's one attention layer by a per-layer list) gives the same losses and grad norms on every layout: packed,
dynamically CP-split over 2 ranks (local and flash attention), and a hybrid Mamba model packed,
each against the plain unpacked single-rank run with the same flags (3 steps, float32
rounding); so do an MTP model (its depth is windowed too) and multi-latent attention,
dynamically CP-split. The window is narrower than most samples, so it changes the model: the unpacked
run without it has other losses (the comparison can fail). The attention math itself is
checked against a float64 windowed softmax in tests/unit_tests/varlen/attention/
test_sliding_window.py.
"""

import pytest

from tests.harness.training_runs import assert_same_history
from tests.unit_tests.varlen_training.test_mla import MLA
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
    # an MTP depth is layer 5 (megatron-core's numbering): windowed by the int frequency
    "mtp unpacked": ("mtp1", "u_single", WINDOW),
    "mtp dynamic cp": ("mtp1", "d_cp2", WINDOW),
    # multi-latent attention: the same core attention, keys wider than values
    "mla unpacked": ("dense", "u_single", WINDOW + tuple(MLA)),
    "mla dynamic cp": ("dense", "d_cp2", WINDOW + tuple(MLA)),
    "mla unpacked, no window": ("dense", "u_single", tuple(MLA)),
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


@pytest.mark.parametrize("feature, layout", [("hybrid", "packed"), ("mtp", "dynamic cp"),
                                             ("mla", "dynamic cp")])
def test_other_models_equal_their_unpacked_run(runs, feature, layout):
    assert_same_history(runs[f"{feature} {layout}"], runs[f"{feature} unpacked"], RTOL,
                        f"{feature} {layout}")


@pytest.mark.parametrize("feature", ["dense", "hybrid", "mla"])
def test_the_window_changes_the_model(runs, feature):
    """By more than the layouts may differ: the equivalence above can tell the two apart (the
    tiny MLA attends almost uniformly at its initialisation: its window moves the grad norm
    by about 6e-5, layouts by about 1e-7)."""
    windowed, full = runs[f"{feature} unpacked"], runs[f"{feature} unpacked, no window"]
    change = max(abs(mine[key] - theirs[key]) / abs(theirs[key])
                 for mine, theirs in zip(windowed, full) for key in ("lm_loss", "grad_norm"))
    assert change > 3 * RTOL, (feature, change)
