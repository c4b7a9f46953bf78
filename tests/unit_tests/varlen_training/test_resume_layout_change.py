"""A run saved on one parallel layout and resumed, optimizer state and all, on another continues
as the uninterrupted run does: 2 iterations + save + load on the new layout + 2 iterations ==
the straight 4 iterations on one rank (lm loss and grad norm within 1e-5 relative, float32
rounding; the 4th iteration's numbers depend on the Adam moments loaded, not only the weights).

Layout changes covered (the probe's cells, tools/probe_combinations.py ``--resume-on``, which
ran a wider matrix: docs/ARCHITECTURE.md "Checkpoints"):

- Adam: DP 2 -> 1, DP 2 -> TP 2, TP 2 -> PP 2, TP 2 -> packed dynamic CP 2, even PP 2 ->
  uneven PP 2 (one layer on the first stage, three on the last: every layer moves stage or
  index);
- ``--use-distributed-optimizer`` (dp_reshardable state): DP 2 -> 1 and DP 1 -> 2.

Three launches (2 ranks, 1 rank, 2 ranks: saves, then the loads of each), about a minute on 2
shared cores.
"""

import os

import pytest

from tests.harness.multirank import run_distributed
from tests.harness.training_runs import train_on_this_rank
from tools.probe_combinations import RESUME_ITERS, RTOL, cell_argv

LAUNCH_TIMEOUT_S = 300
METRICS = ("lm_loss", "grad_norm")
HALF = RESUME_ITERS // 2
SCHEDULE = ["--lr-decay-iters", str(RESUME_ITERS)]  # the LR must not depend on the stop


def _argv(feature: str, layout: str, iters: int, *extra: str) -> list[str]:
    argv, _, _ = cell_argv(feature, layout, "none")
    return argv + SCHEDULE + ["--train-iters", str(iters), *extra]


def _saved(feature: str, layout: str, folder: str) -> list[str]:
    return _argv(feature, layout, HALF, "--save", os.path.join(folder, f"{feature}_{layout}"))


def _resumed(feature: str, layout: str, folder: str, saved_layout: str) -> list[str]:
    return _argv(feature, layout, RESUME_ITERS,
                 "--load", os.path.join(folder, f"{feature}_{saved_layout}"))


def _plans(folder: str) -> list[tuple[int, dict[str, list[str]]]]:
    """(world size, {name: argv}) per launch, in launch order."""
    return [
        (2, {"save dense u_dp2": _saved("dense", "u_dp2", folder),
             "save dense u_tp2": _saved("dense", "u_tp2", folder),
             "save dense u_pp2": _saved("dense", "u_pp2", folder),
             "save dist_opt u_dp2": _saved("dist_opt", "u_dp2", folder)}),
        (1, {"straight dense": _argv("dense", "u_single", RESUME_ITERS),
             "straight dist_opt": _argv("dist_opt", "u_single", RESUME_ITERS),
             "save dist_opt u_single": _saved("dist_opt", "u_single", folder),
             "dense u_dp2 -> u_single": _resumed("dense", "u_single", folder, "u_dp2"),
             "dist_opt u_dp2 -> u_single": _resumed("dist_opt", "u_single", folder, "u_dp2")}),
        (2, {"dense u_dp2 -> u_tp2": _resumed("dense", "u_tp2", folder, "u_dp2"),
             "dense u_tp2 -> u_pp2": _resumed("dense", "u_pp2", folder, "u_tp2"),
             "dense u_tp2 -> d_cp2": _resumed("dense", "d_cp2", folder, "u_tp2"),
             "dense u_pp2 -> u_pp2_uneven": _resumed("dense", "u_pp2_uneven", folder, "u_pp2"),
             "dist_opt u_single -> u_dp2": _resumed("dist_opt", "u_dp2", folder, "u_single")}),
    ]


def _run_all(plan: dict[str, list[str]]) -> dict[str, dict]:
    out = {}
    for name, argv in plan.items():
        result = train_on_this_rank(argv)
        out[name] = {"owns_loss": result["owns_loss"], "history": [
            {key: step.get(key) for key in METRICS} for step in result["history"]]}
    return out


@pytest.fixture(scope="module")
def histories(tmp_path_factory) -> dict[str, list[dict]]:
    """Each run's metrics on the last rank that owns the loss."""
    folder = str(tmp_path_factory.mktemp("layout_change"))
    out = {}
    for world, plan in _plans(folder):
        per_rank = run_distributed(_run_all, world, args=(plan,), timeout_s=LAUNCH_TIMEOUT_S)
        for name in plan:
            out[name] = next(ranks[name] for ranks in reversed(per_rank)
                             if ranks[name]["owns_loss"])["history"]
    return out


@pytest.mark.parametrize("resumed, saved", [
    ("dense u_dp2 -> u_single", "save dense u_dp2"),
    ("dense u_dp2 -> u_tp2", "save dense u_dp2"),
    ("dense u_tp2 -> u_pp2", "save dense u_tp2"),
    ("dense u_tp2 -> d_cp2", "save dense u_tp2"),
    ("dense u_pp2 -> u_pp2_uneven", "save dense u_pp2"),
    ("dist_opt u_dp2 -> u_single", "save dist_opt u_dp2"),
    ("dist_opt u_single -> u_dp2", "save dist_opt u_single"),
])
def test_resume_on_another_layout_continues_the_straight_run(histories, resumed, saved):
    straight = histories[f"straight {resumed.split()[0]}"]
    got = histories[saved] + histories[resumed]
    assert len(got) == len(straight) == RESUME_ITERS
    for it, (mine, want) in enumerate(zip(got, straight), start=1):
        for key in METRICS:
            assert mine[key] == pytest.approx(want[key], rel=RTOL), (
                f"{resumed}: iteration {it} {key} {mine[key]} != straight {want[key]}")
