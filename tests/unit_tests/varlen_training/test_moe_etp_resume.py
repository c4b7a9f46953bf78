"""Resuming an MoE run at another expert tensor-parallel size (``--expert-tensor-parallel-size``,
recorded in ``run_args.json``): with the plain optimizer megatron-core reshards the experts'
weights and state, so 2 + save + load + 2 iterations == the straight 4 at the new size (lm
loss, balancing losses, grad norm within 1e-5; ETP 1 -> 2 at TP 1 x EP 2, and ETP 2 -> 1 at
TP 2 x EP 2, whose ETP defaulted to TP). With
``--use-distributed-optimizer`` megatron-core stopped every rank with a global-shape
CheckpointingException traceback (probed: ETP 2 saved, ETP 1 resumed); the change is refused
in one line naming ``--no-load-optim``, which loads the weights alone. A checkpoint saved
before ETP was recorded resumes unchecked.

One 4-rank launch runs all of it (EP 2 x ETP 2 needs 4 ranks).
"""

import json

import pytest

from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.resume.consistency import check_run_args
from megatron.varlen_training.resume.run_args_keys import (
    EXPERT_TENSOR_PARALLEL_KEY, RUN_ARGS_FILENAME,
)
from megatron.varlen_training.resume.run_args_record import save_run_args
from tests.harness.multirank import run_distributed
from tests.unit_tests.varlen_training.test_moe_checkpoint import (
    BASE,
    DISTRIBUTED,
    EP2,
    FULLY_RESHARDABLE_REMEDY,
    METRICS,
    RTOL,
    WORLD,
    _runs_on_this_rank,
    _save_at_2,
)

LAUNCH_TIMEOUT_S = 420  # eight tiny runs and a refusal; 4 ranks share 2 cores on the CI machine
ETP1 = ["--expert-tensor-parallel-size", "1"]
ETP2 = ["--expert-tensor-parallel-size", "2"]
TP2 = ["--tensor-model-parallel-size", "2", "--sequence-parallel"]  # ETP defaults to TP


def _planned_runs(folder) -> dict[str, list[str]]:
    """Saves at iteration 2, the straight runs, then the loads of those saves (in this order)."""
    etp1, etp2_distributed = folder / "etp1", folder / "etp2_distributed"
    return {
        "save_etp1": BASE + EP2 + ETP1 + _save_at_2(etp1),
        "save_tp2": BASE + TP2 + EP2 + _save_at_2(folder / "tp2"),
        "save_etp2_distributed": BASE + EP2 + ETP2 + DISTRIBUTED + _save_at_2(etp2_distributed),
        "straight_etp1": BASE + EP2 + ETP1,
        "straight_etp2": BASE + EP2 + ETP2,
        "straight_tp2_etp1": BASE + TP2 + EP2 + ETP1,
        "etp1_to_etp2": BASE + EP2 + ETP2 + ["--load", str(etp1)],
        "tp2_to_tp2_etp1": BASE + TP2 + EP2 + ETP1 + ["--load", str(folder / "tp2")],
        "etp2_to_etp1_distributed": BASE + EP2 + ETP1 + DISTRIBUTED + [
            "--load", str(etp2_distributed)],
        "etp2_to_etp1_distributed_weights": BASE + EP2 + ETP1 + DISTRIBUTED + [
            "--load", str(etp2_distributed), "--no-load-optim"],
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    """Each run's result on the last rank that owns the loss (rank 0's for a refusal)."""
    folder = tmp_path_factory.mktemp("moe_etp_checkpoints")
    planned = _planned_runs(folder)
    per_rank = run_distributed(_runs_on_this_rank, WORLD, args=(planned,),
                               timeout_s=LAUNCH_TIMEOUT_S)
    results = {name: next((ranks[name] for ranks in reversed(per_rank)
                           if ranks[name]["owns_loss"]), per_rank[0][name]) for name in planned}
    results["folder"] = folder
    return results


def _assert_close(got: list[dict], want: list[dict], name: str) -> None:
    assert len(got) == len(want) == 2, name
    for index, (one, ref) in enumerate(zip(got, want)):
        for key in METRICS:
            assert one[key] == pytest.approx(ref[key], rel=RTOL), (name, index, key)


@pytest.mark.parametrize("saved, resumed, straight", [
    ("save_etp1", "etp1_to_etp2", "straight_etp2"),  # TP 1: ETP 1 -> 2
    ("save_tp2", "tp2_to_tp2_etp1", "straight_tp2_etp1"),  # TP 2: ETP 2 (the default) -> 1
])
def test_plain_optimizer_resume_at_another_etp_equals_the_straight_run(runs, saved, resumed,
                                                                       straight):
    """The saved run's first 2 iterations are those of the straight run too: every layout here
    starts from the same weights (layout-invariant initialisation)."""
    _assert_close(runs[saved]["history"], runs[straight]["history"][:2], saved)
    _assert_close(runs[resumed]["history"], runs[straight]["history"][2:], resumed)


def test_run_args_record_the_expert_tensor_parallel_size(runs):
    for name, size in (("etp1", 1), ("etp2_distributed", 2), ("tp2", 2)):
        recorded = json.loads((runs["folder"] / name / "iter_0000002" /
                               RUN_ARGS_FILENAME).read_text())
        assert recorded[EXPERT_TENSOR_PARALLEL_KEY] == size, name


def test_distributed_optimizer_etp_change_is_one_line(runs):
    assert len(runs["save_etp2_distributed"]["history"]) == 2
    assert runs["etp2_to_etp1_distributed"]["refusal"] == (
        "--load: the checkpoint's distributed optimizer state was saved with "
        "--expert-tensor-parallel-size 2, this run has 1: its format (megatron-core's "
        "dp_reshardable) reshards over data-parallel ranks only (resume with "
        "--expert-tensor-parallel-size 2, or add --no-load-optim to load the weights only; "
        f"{FULLY_RESHARDABLE_REMEDY})")


def test_distributed_optimizer_etp_change_keeps_the_weights(runs):
    """--no-load-optim (the refusal's other remedy): the experts' weights reshard, so the
    first resumed loss, computed before any update, is the straight run's at iteration 3."""
    got = runs["etp2_to_etp1_distributed_weights"]["history"]
    assert len(got) == 2
    assert got[0]["lm_loss"] == pytest.approx(runs["straight_etp1"]["history"][2]["lm_loss"],
                                              rel=RTOL)


def _moe_run(*extra: str):
    return parse_run_config(BASE + EP2 + list(extra), world_size=WORLD)


@pytest.mark.parametrize("saved, resumed", [(ETP1, ETP2), (ETP2, ETP1)])
def test_checkpoint_without_the_recorded_etp_resumes(tmp_path, saved, resumed):
    """Checkpoints written before ETP was recorded: their size is unknown (no default could be
    right for both), so it is not compared."""
    save_run_args(str(tmp_path), _moe_run(*saved, *DISTRIBUTED), iteration=2)
    path = tmp_path / RUN_ARGS_FILENAME
    recorded = json.loads(path.read_text())
    del recorded[EXPERT_TENSOR_PARALLEL_KEY]
    path.write_text(json.dumps(recorded))
    assert check_run_args(str(tmp_path), _moe_run(*resumed, *DISTRIBUTED)) is None
