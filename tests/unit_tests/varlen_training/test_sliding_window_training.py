"""Training with a sliding window (``--window-size 5,0 --window-attn-skip-freq 2``: layers 1
and 3 windowed, 2 and 4 full; the hybrid's one attention layer by a per-layer list) gives the
same losses and grad norms on every layout: packed, dynamically CP-split over 2 ranks (local
and flash attention), and a hybrid Mamba model packed, each against the plain unpacked
single-rank run with the same flags (3 steps, float32 rounding); so do an MTP model (its depth
is windowed too) and multi-latent attention, dynamically CP-split. The window is narrower than
most samples, so it changes the model: the unpacked run without it has other losses (the
comparison can fail). The attention math itself is
checked against a float64 windowed softmax in tests/unit_tests/varlen/attention/
test_sliding_window.py. Four runs (dense packed, hybrid unpacked, MTP and MLA dynamically
CP-split) also log their metrics: each step's FLOPs must count the windowed layers' work,
computed here by hand from the dataset's lengths.
"""

import dataclasses
import json

import numpy as np
import pytest

from megatron.varlen_training.config.from_flags import parse_hybrid_run_config, parse_run_config
from megatron.varlen_training.datasets.builder import build_datasets
from megatron.varlen_training.flops import FORWARD_AND_BACKWARD
from megatron.varlen_training.hybrid_model import HYBRID
from megatron.varlen_training.model_family import GPT
from megatron.varlen_training.tokenizer import build_tokenizer
from tests.harness.training_runs import assert_same_history
from tests.unit_tests.varlen_training.test_mla import MLA
from tools.probe_combinations import cell_argv, launch

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
# name: windowed attention layers, by hand (dense: layers 1 and 3 of 4; hybrid: layer 2; MTP:
# 1, 3 and its depth, layer 5)
METRICS_RUNS = {"dense packed": 2, "hybrid unpacked": 1, "mtp dynamic cp": 3,
                "mla dynamic cp": 2}


@pytest.fixture(scope="module")
def metrics_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("window_metrics")


@pytest.fixture(scope="module")
def runs(metrics_dir) -> dict:
    def extra_flags(name, extra):
        if name not in METRICS_RUNS:
            return extra
        return extra + ("--log-metrics-jsonl", str(metrics_dir / f"{name}.jsonl"))

    results = {name: launch(feature, layout, "none", extra_flags(name, extra))
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


def _windowed_squared_tokens(length: int, window: int) -> int:
    """2 * (pairs the causal window mask allows) - its band width: the squared tokens of the
    FLOPs convention (full attention: 2 * pairs - L = L^2)."""
    query, key = np.arange(length)[:, None], np.arange(length)[None, :]
    pairs = int(((key <= query) & (key >= query - window)).sum())
    return 2 * pairs - min(length, window + 1)


def _core_attention_width(model) -> int:
    """Forward FLOPs of causal attention per squared token: QK^T and AV over half the pairs,
    2 FLOPs per multiply-add, per head the query/key plus the value width."""
    if model.mla is None:
        return 2 * model.num_attention_heads * model.head_dim
    mla = model.mla
    return model.num_attention_heads * (mla.qk_head_dim + mla.qk_pos_emb_head_dim
                                        + mla.v_head_dim)


@pytest.mark.parametrize("name", list(METRICS_RUNS))
def test_step_flops_count_the_windowed_layers(runs, metrics_dir, name):
    feature, layout, extra = RUNS[name]
    argv, world, hybrid = cell_argv(feature, layout, "none")
    run = (parse_hybrid_run_config if hybrid else parse_run_config)(argv + list(extra), world)
    family, model = (HYBRID if hybrid else GPT), run.model
    full = dataclasses.replace(model, window_size=None, window_attn_skip_freq=None)
    dataset, _ = build_datasets(run, build_tokenizer(run.data.tokenizer_type, model.vocab_size))
    records = [json.loads(line)
               for line in (metrics_dir / f"{name}.jsonl").read_text().splitlines()]
    gbs, window = run.training.global_batch_size, model.window_size[0]
    assert len(records) == len(runs[name]) == 3
    for it, record in enumerate(records):
        lengths = [dataset[i]["length"] for i in range(it * gbs, (it + 1) * gbs)]
        squares = sum(n * n for n in lengths)
        windowed = sum(_windowed_squared_tokens(n, window) for n in lengths)
        assert windowed < squares  # the window is narrower than some sample
        saved = (FORWARD_AND_BACKWARD * _core_attention_width(model) * METRICS_RUNS[name]
                 * (squares - windowed))
        flops = family.flops(full, sum(lengths), squares) - saved
        assert record["seqlen_squared_sum"] == squares
        assert record["tflops_per_device"] == pytest.approx(
            flops / (record["step_time_s"] * world * 1e12), rel=1e-9)
