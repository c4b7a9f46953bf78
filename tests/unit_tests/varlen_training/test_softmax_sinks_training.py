"""Training with attention sinks (``--softmax-type learnable``: gpt-oss's per-head sink, a
parameter of every attention layer) gives the same losses and grad norms packed, dynamically
CP-split over 2 ranks and on TP 2 (the sink split over TP like the heads: initialised
layout-invariantly, counted once in the grad norm) as the plain unpacked single-rank run (3
steps, float32 rounding). A checkpoint saved on TP 2 resumes on one rank as the straight run
goes on (the sink's checkpoint axis is its heads). ``off-by-one`` and ``learnable`` are other
models than the plain softmax (their losses differ). The attention math against a float64
reference is in tests/unit_tests/varlen/attention/test_softmax_sinks.py.
"""

import pytest

from tests.harness.training_runs import assert_same_history
from tools.probe_combinations import launch, launch_resume

RTOL = 1e-5
LEARNABLE = ("--softmax-type", "learnable")
# name: (feature, layout, extra flags)
RUNS = {
    "unpacked": ("dense", "u_single", LEARNABLE),
    "packed": ("dense", "p_single", LEARNABLE),
    "dynamic cp": ("dense", "d_cp2", LEARNABLE),
    "tp2": ("dense", "u_tp2", LEARNABLE),
    "off-by-one": ("dense", "u_single", ("--softmax-type", "off-by-one")),
    "vanilla": ("dense", "u_single", ()),
}


@pytest.fixture(scope="module")
def runs() -> dict:
    results = {name: launch(feature, layout, "none", extra)
               for name, (feature, layout, extra) in RUNS.items()}
    for name, result in results.items():
        assert result["status"] == "ran", (name, result.get("reason"), result.get("error"))
    return {name: result["history"] for name, result in results.items()}


@pytest.mark.parametrize("name", ["packed", "dynamic cp", "tp2"])
def test_layouts_equal_the_unpacked_run(runs, name):
    assert len(runs[name]) == 3
    assert_same_history(runs[name], runs["unpacked"], RTOL, name)


@pytest.mark.parametrize("name", ["off-by-one", "unpacked"])
def test_a_sink_changes_the_model(runs, name):
    change = max(abs(mine["lm_loss"] - theirs["lm_loss"]) / theirs["lm_loss"]
                 for mine, theirs in zip(runs[name], runs["vanilla"]))
    assert change > 10 * RTOL, (name, change)


def test_a_tp2_checkpoint_resumes_on_one_rank(tmp_path):
    result = launch_resume("dense", "u_tp2", "none", str(tmp_path), LEARNABLE,
                           resume_layout="u_single")
    assert result["status"] == "ran", (result.get("reason"), result.get("error"))
    assert_same_history(result["resumed"], result["history"], RTOL, "resumed on one rank")


def test_a_resume_or_fine_tune_keeps_the_softmax(tmp_path):
    """Recorded: a learnable sink is a parameter of each attention layer, off-by-one another
    attention; changing either is refused in one line naming the flag."""
    from megatron.varlen_training.config.from_flags import parse_run_config
    from megatron.varlen_training.errors import CheckpointError
    from megatron.varlen_training.load_options import FINETUNE
    from megatron.varlen_training.resume.consistency import check_run_args
    from megatron.varlen_training.resume.run_args_record import save_run_args
    from tools.probe_combinations import cell_argv

    argv, _, _ = cell_argv("dense", "u_single", "none")
    save_run_args(str(tmp_path), parse_run_config(argv + list(LEARNABLE), world_size=1),
                  iteration=3)
    other = parse_run_config(argv + ["--softmax-type", "off-by-one"], world_size=1)
    for parts in ({}, {"parts": FINETUNE}):
        with pytest.raises(CheckpointError) as err:
            check_run_args(str(tmp_path), other, check_data=False, **parts)
        assert "--softmax-type" in str(err.value) and "\n" not in str(err.value)
