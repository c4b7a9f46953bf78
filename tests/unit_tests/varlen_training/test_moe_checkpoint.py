"""MoE checkpoints (megatron-core's dist_checkpointing of the experts): 2 + save + load + 2
iterations == the straight 4 iterations at the resumed layout (lm loss, balancing losses and
grad norm within 1e-5), at an unchanged expert-parallel size, across sizes > 1 (EP 2 -> 4
and 4 -> 2: megatron-core reshards the experts and their optimizer state by global expert
index) and between EP 1 and 2 with the optimizer state (a separate expert optimizer exists
only with EP > 1: checkpoint/optimizer_nesting.py converts the common state), with the plain
optimizer and with the distributed optimizer's fully_reshardable format. Iteration 4 follows
the loaded Adam moments: a weights-only resume (--no-load-optim) differs there. What cannot be
resharded is refused in one line before megatron-core reads the checkpoint: an EP change with
the distributed optimizer's dp_reshardable format (it reshards over data-parallel ranks only)
and a dense checkpoint loaded into an MoE model. The router's expert bias
(--moe-router-enable-expert-bias) is saved and restored with the model.

Every run shares one 4-rank launch (starting 4 ranks costs more than a tiny run): a small
multi-rank test with an explicit timeout, about a minute on 2 shared cores.
"""

import gc

import pytest

from megatron.varlen_training.errors import CheckpointError
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import train_on_this_rank
from tests.unit_tests.varlen_training.test_moe_equivalence import GPT, PACKED

RTOL = 1e-5
METRICS = ("lm_loss", "seq_load_balancing_loss", "z_loss", "grad_norm")
WORLD = 4  # EP 4 with 4 experts needs 4 ranks
LAUNCH_TIMEOUT_S = 600  # twenty-one tiny runs; 4 ranks share 2 cores on the CI machine
EP1 = ["--expert-model-parallel-size", "1"]
EP2 = ["--expert-model-parallel-size", "2"]
EP4 = ["--expert-model-parallel-size", "4"]
DISTRIBUTED = ["--use-distributed-optimizer"]
RESHARDABLE = DISTRIBUTED + ["--dist-ckpt-optim-fully-reshardable"]
# The last remedy of a dp_reshardable refusal: how to save a checkpoint that follows the change.
FULLY_RESHARDABLE_REMEDY = ("a save with --dist-ckpt-optim-fully-reshardable is resumable at "
                            "another layout")
# Aux-loss-free balancing: a rate at which the bias changes the routing within the 4 iterations
# (a resume that lost the bias differs at iteration 3). The bias's token count is a
# torch.compile'd function in megatron-core: eager here (its cold compile on 4 ranks sharing 2
# cores took ~25 s of the launch; what is saved and restored is the same; the compiled count
# stays in test_combination_equivalence's moe_expert_bias cell). The flag turns dynamo off for
# the rest of the rank process, so these runs end the launch (_planned_runs).
BIAS = ["--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
        "--moe-router-bias-update-rate", "0.01", "--disable-jit-fuser"]
BASE = GPT + PACKED + ["--train-iters", "4", "--lr-decay-iters", "4"]
_CUT = GPT.index("--num-experts")
DENSE = (GPT[:_CUT] + ["--disable-bias-linear"] + GPT[GPT.index("--hidden-size"):] + PACKED
         + ["--train-iters", "4", "--lr-decay-iters", "4"])


def _save_at_2(folder) -> list[str]:
    return ["--exit-interval", "2", "--save", str(folder), "--save-interval", "2"]


def _metrics_or_refusal(argv: list[str]) -> dict:
    """One run on this rank: its metrics per iteration, or the one-line refusal of its load."""
    try:
        result = train_on_this_rank(argv)
    except CheckpointError as err:
        return {"owns_loss": False, "refusal": str(err)}
    history = [{key: step.get(key) for key in METRICS} for step in result["history"]]
    return {"owns_loss": result["owns_loss"], "history": history}


def freeze_what_is_alive() -> None:
    """megatron-core's distributed optimizer calls gc.collect() in every sharded_state_dict
    (each save and load, once per chained optimizer), which walks every object torch and
    megatron-core created on import: ~0.6 s a call per rank here. Frozen once, they are left
    out of those walks (gc.freeze); each run's own objects are still collected."""
    gc.collect()
    gc.freeze()


def _runs_on_this_rank(runs: dict[str, list[str]]) -> dict[str, dict]:
    freeze_what_is_alive()
    return {name: _metrics_or_refusal(argv) for name, argv in runs.items()}  # in order


def _save_at_2_and_go_on(folder) -> list[str]:
    """A straight run that also saves at iteration 2 (and 4): a separate 2-iteration run would
    save the same checkpoint, one run more in the launch. Loaded with :func:`_load_2`."""
    return ["--save", str(folder), "--save-interval", "2"]


def _load_2(folder) -> list[str]:
    return ["--load", str(folder), "--ckpt-step", "2"]


def _planned_runs(folder) -> dict[str, list[str]]:
    """The straight runs (saving at iteration 2) and the other saves, then the loads of those
    saves (in this order); the expert-bias runs (eager: --disable-jit-fuser) last."""
    ep1, ep2, ep4, ep1_reshardable, ep2_reshardable, ep2_distributed, dense, bias = (
        folder / name for name in ("ep1", "ep2", "ep4", "ep1_reshardable", "ep2_reshardable",
                                   "ep2_distributed", "dense", "bias"))
    return {
        "straight_ep1": BASE + EP1 + _save_at_2_and_go_on(ep1),
        "straight_ep2": BASE + EP2 + _save_at_2_and_go_on(ep2),
        "straight_ep4": BASE + EP4 + _save_at_2_and_go_on(ep4),
        "save_ep1_reshardable": BASE + EP1 + RESHARDABLE + _save_at_2(ep1_reshardable),
        "save_ep2_reshardable": BASE + EP2 + RESHARDABLE + _save_at_2(ep2_reshardable),
        "save_ep2_distributed": BASE + EP2 + DISTRIBUTED + _save_at_2(ep2_distributed),
        "save_dense": DENSE + _save_at_2(dense),
        "ep2_to_ep2": BASE + EP2 + _load_2(ep2),
        "ep2_to_ep4": BASE + EP4 + _load_2(ep2),
        "ep4_to_ep2": BASE + EP2 + _load_2(ep4),
        "ep1_to_ep2": BASE + EP2 + _load_2(ep1),
        "ep2_to_ep1": BASE + EP1 + _load_2(ep2),
        "ep1_to_ep2_reshardable": BASE + EP2 + RESHARDABLE + ["--load", str(ep1_reshardable)],
        "ep2_to_ep1_reshardable": BASE + EP1 + RESHARDABLE + ["--load", str(ep2_reshardable)],
        "ep1_to_ep2_weights": BASE + EP2 + _load_2(ep1) + ["--no-load-optim"],
        "ep2_to_ep4_distributed": BASE + EP4 + DISTRIBUTED + ["--load", str(ep2_distributed)],
        "ep2_to_ep4_distributed_weights": BASE + EP4 + DISTRIBUTED + [
            "--load", str(ep2_distributed), "--no-load-optim"],
        "dense_to_moe": BASE + EP2 + ["--load", str(dense)],
        "save_bias_ep2": BASE + BIAS + EP2 + _save_at_2(bias),
        "straight_bias_ep4": BASE + BIAS + EP4,
        "bias_ep2_to_ep4": BASE + BIAS + EP4 + ["--load", str(bias)],
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    """Each run's result on the last rank that owns the loss (rank 0's for a refusal)."""
    planned = _planned_runs(tmp_path_factory.mktemp("moe_checkpoints"))
    per_rank = run_distributed(_runs_on_this_rank, WORLD, args=(planned,),
                               timeout_s=LAUNCH_TIMEOUT_S)
    return {name: next((ranks[name] for ranks in reversed(per_rank) if ranks[name]["owns_loss"]),
                       per_rank[0][name]) for name in planned}


@pytest.mark.parametrize("resumed, saved, straight", [
    ("ep2_to_ep2", "straight_ep2", "straight_ep2"),
    ("ep2_to_ep4", "straight_ep2", "straight_ep4"),
    ("ep4_to_ep2", "straight_ep4", "straight_ep2"),
    ("bias_ep2_to_ep4", "save_bias_ep2", "straight_bias_ep4"),
    ("ep1_to_ep2", "straight_ep1", "straight_ep2"),
    ("ep2_to_ep1", "straight_ep2", "straight_ep1"),
    # The distributed optimizer's numbers are the plain one's (float32 Adam either way).
    ("ep1_to_ep2_reshardable", "save_ep1_reshardable", "straight_ep2"),
    ("ep2_to_ep1_reshardable", "save_ep2_reshardable", "straight_ep1"),
])
def test_resume_equals_the_straight_run_at_the_new_expert_parallel_size(runs, resumed, saved,
                                                                        straight):
    assert "refusal" not in runs[resumed], runs[resumed].get("refusal")
    straight_run = runs[straight]["history"]
    for name, got, want in ((saved, runs[saved]["history"][:2], straight_run[:2]),
                            (resumed, runs[resumed]["history"], straight_run[2:])):
        assert len(got) == len(want) == 2, name
        for index, (one, ref) in enumerate(zip(got, want)):
            for key in METRICS:
                assert one[key] == pytest.approx(ref[key], rel=RTOL), (name, index, key)


def test_expert_parallel_one_to_many_keeps_the_weights(runs):
    """--no-load-optim (a fresh optimizer): the experts' weights reshard by global index, so
    the first resumed loss, computed before any update, is the straight run's at iteration 3
    (EP 1 and EP 2 train the same model); the update it makes with fresh Adam moments is not
    the straight run's, so the equality above at iteration 4 is the loaded optimizer state's."""
    got, want = runs["ep1_to_ep2_weights"]["history"], runs["straight_ep2"]["history"][2:]
    assert len(got) == 2
    assert got[0]["lm_loss"] == pytest.approx(want[0]["lm_loss"], rel=RTOL)
    assert got[1]["grad_norm"] != pytest.approx(want[1]["grad_norm"], rel=100 * RTOL)


def test_expert_parallel_change_with_distributed_optimizer_is_one_line(runs):
    """Without the check megatron-core raised a KeyError per rank for the state of expert
    data-parallel groups the checkpoint does not have."""
    assert len(runs["save_ep2_distributed"]["history"]) == 2
    assert runs["ep2_to_ep4_distributed"]["refusal"] == (
        "--load: the checkpoint's distributed optimizer state was saved with "
        "--expert-model-parallel-size 2, this run has 4: its format (megatron-core's "
        "dp_reshardable) reshards over data-parallel ranks only (resume with "
        "--expert-model-parallel-size 2, or add --no-load-optim to load the weights only; "
        f"{FULLY_RESHARDABLE_REMEDY})")


def test_expert_parallel_change_with_distributed_optimizer_keeps_the_weights(runs):
    """--no-load-optim (the refusal's other remedy): the experts' weights reshard, so the
    first resumed loss, computed before any update, is the straight run's at iteration 3."""
    got = runs["ep2_to_ep4_distributed_weights"]["history"]
    assert len(got) == 2
    assert got[0]["lm_loss"] == pytest.approx(runs["straight_ep4"]["history"][2]["lm_loss"],
                                              rel=RTOL)


def test_dense_checkpoint_is_not_an_moe_model(runs):
    assert len(runs["save_dense"]["history"]) == 2
    assert "--num-experts" in runs["dense_to_moe"]["refusal"]
