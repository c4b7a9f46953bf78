"""--no-rope-freq (Llama-4's NoPE layers, Megatron-LM's flag): the chosen layers skip RoPE.

Independent reference: with every layer skipping it (``--no-rope-freq 1``) the model is the
same as one without position encoding (``--position-embedding-type none``: RoPE has no
weights, so both start from the same weights) and trains to the same losses, bit for bit;
with every other layer skipping it, it is neither that model nor the all-RoPE one. Packed and
dynamically CP-split runs equal the unpacked run (3 steps, float32 rounding). Plus the
refusals and the config field against Megatron-LM's (test_transformer_config_reference.py).
"""

import pytest

from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.flag_errors import ArgumentValidationError
from tests.harness.training_runs import assert_same_history
from tools.probe_combinations import cell_argv, launch

RTOL = 1e-5
RUNS = {
    "every layer": ("u_single", ("--no-rope-freq", "1")),
    "no position encoding": ("u_single", ("--position-embedding-type", "none")),
    "all rope": ("u_single", ()),
    "every other": ("u_single", ("--no-rope-freq", "2")),
    "every other packed": ("p_single", ("--no-rope-freq", "([0]+[1])*2")),
    "every other dynamic cp": ("d_cp2", ("--no-rope-freq", "2")),
}


@pytest.fixture(scope="module")
def runs() -> dict:
    results = {name: launch("dense", layout, "none", extra)
               for name, (layout, extra) in RUNS.items()}
    for name, result in results.items():
        assert result["status"] == "ran", (name, result.get("reason"), result.get("error"))
    return {name: result["history"] for name, result in results.items()}


def test_no_layer_with_rope_is_the_model_without_position_encoding(runs):
    assert runs["every layer"] == runs["no position encoding"]


@pytest.mark.parametrize("other", ["no position encoding", "all rope"])
def test_skipping_some_layers_is_another_model(runs, other):
    """By more than the layouts below may differ (so their comparison can tell RoPE skipped
    on no layer, or on all of them, from the pattern)."""
    change = max(abs(mine[key] - theirs[key]) / abs(theirs[key])
                 for mine, theirs in zip(runs["every other"], runs[other])
                 for key in ("lm_loss", "grad_norm"))
    assert change > 3 * RTOL, (other, change)


@pytest.mark.parametrize("name", ["every other packed", "every other dynamic cp"])
def test_layouts_equal_the_unpacked_run(runs, name):
    assert len(runs[name]) == 3
    assert_same_history(runs[name], runs["every other"], RTOL, name)


@pytest.mark.parametrize("flags, words", [
    (["--no-rope-freq", "3"], ["--no-rope-freq 3", "divide --num-layers 4"]),
    (["--no-rope-freq", "[1,0,1]"], ["--no-rope-freq has 3 entries", "--num-layers 4"]),
    (["--no-rope-freq", "2", "--position-embedding-type", "learned_absolute"],
     ["--no-rope-freq", "--position-embedding-type rope"]),
    (["--no-rope-freq", "2", "--mtp-num-layers", "1"], ["--no-rope-freq", "--mtp-num-layers 1"]),
    (["--no-rope-freq", "2", "--multi-latent-attention"], ["--no-rope-freq",
                                                           "multi-latent attention"]),
    (["--no-rope-freq", "[2,0,1,0]"], ["--no-rope-freq", "list of 0/1"]),
])
def test_what_megatron_core_cannot_run_is_one_line(flags, words):
    argv, _, _ = cell_argv("dense", "u_single", "none")
    with pytest.raises((ArgumentValidationError, SystemExit)) as err:
        parse_run_config(argv + flags, world_size=1)
    if err.type is SystemExit:  # argparse's type error: exit code 2, message printed
        assert err.value.code == 2
        return
    for word in words:
        assert word in str(err.value), (word, str(err.value))
    assert "\n" not in str(err.value)


def test_the_run_keeps_the_pattern_and_megatron_core_gets_a_list():
    from megatron.varlen_training.model import build_transformer_config

    argv, _, _ = cell_argv("dense", "u_single", "none")
    run = parse_run_config(argv + ["--no-rope-freq", "[0,1,0,1]"], world_size=1)
    assert run.model.no_rope_freq == (0, 1, 0, 1)
    assert build_transformer_config(run).no_rope_freq == [0, 1, 0, 1]
    run = parse_run_config(argv + ["--no-rope-freq", "2"], world_size=1)
    assert build_transformer_config(run).no_rope_freq == [0, 1, 0, 1]  # megatron-core's expansion
