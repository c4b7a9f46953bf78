"""``--log-params-norm`` (Megatron-LM's flag): the L2 norm of the whole model's weights after
each update, the same number on every layout.

Reference: a single-rank run's weights, their norm computed here directly (float64, every
parameter once). The TP2, PP2 and DP2 runs start from the same weights (their initialisation
does not depend on the layout) and train the same data, so after each step their reported norm
equals the reference's within float32 rounding -- a norm that counted a TP-duplicated layer
norm twice, the last stage's copy of the tied word embeddings, or a DP replica, would not.

Mixture-of-Experts (4 experts, a shared expert): expert weights are sharded over expert-parallel
ranks and replicated over expert data-parallel ones, in other groups than the dense weights.
EP2, EP2 x expert-DP2, TP2 with expert TP2, TP2 with EP2 and expert TP1, and PP2 runs must each
report the single-rank run's norm: a norm that missed the other expert-parallel ranks' experts,
or counted an expert data-parallel replica twice, would not.
"""

import functools
import math

import pytest
import torch

from tests.harness.multirank import run_distributed
from tests.harness.training_runs import TINY_GPT_ARGS, stepping_trainer

STEPS = 2
ARGS = TINY_GPT_ARGS + ["--train-iters", str(STEPS), "--global-batch-size", "4",
                        "--log-params-norm"]
LAYOUTS = {"tp2": ["--tensor-model-parallel-size", "2"],
           "pp2": ["--pipeline-model-parallel-size", "2"], "dp2": []}
RTOL = 1e-5  # float32 rounding of the updates across layouts


def _train(argv: list[str]) -> dict:
    with stepping_trainer(argv) as (trainer, state, provider):
        reported, direct = [], []
        for iteration in range(STEPS):
            report = trainer.step(provider.step_batches(iteration))
            reported.append(report.metrics.params_norm)
            direct.append(math.sqrt(sum(float(param.detach().double().square().sum())
                                        for chunk in state.model
                                        for param in chunk.parameters())))
        return {"reported": reported, "direct": direct}


def rank_layouts() -> dict:
    return {name: _train(ARGS + extra) for name, extra in LAYOUTS.items()}


MOE_ARGS = ARGS + ["--micro-batch-size", "1", "--num-experts", "4", "--moe-router-topk", "2",
                   "--moe-ffn-hidden-size", "16", "--moe-shared-expert-intermediate-size", "16",
                   "--disable-bias-linear"]
TP2 = ["--tensor-model-parallel-size", "2", "--sequence-parallel"]
MOE_LAYOUTS = {  # world size: {name: layout flags}
    2: {"ep2": ["--expert-model-parallel-size", "2"],
        "tp2_etp2": TP2,
        "pp2": ["--pipeline-model-parallel-size", "2"]},
    4: {"ep2_expert_dp2": ["--expert-model-parallel-size", "2"],
        "tp2_ep2_etp1": TP2 + ["--expert-model-parallel-size", "2",
                               "--expert-tensor-parallel-size", "1"]},
}


def moe_rank_layouts(world: int) -> dict:
    return {name: _train(MOE_ARGS + extra) for name, extra in MOE_LAYOUTS[world].items()}


def test_params_norm_is_the_whole_models_on_every_layout():
    (reference,) = run_distributed(_train, 1, args=(ARGS,), timeout_s=240)
    assert reference["reported"] == pytest.approx(reference["direct"], rel=1e-12)
    expected = reference["direct"]
    assert expected[0] != expected[1]  # the weights moved: a real comparison
    for rank in run_distributed(rank_layouts, 2, timeout_s=300):
        for name, run in rank.items():
            assert run["reported"] == pytest.approx(expected, rel=RTOL), name


@functools.cache
def _moe_reference() -> list[float]:
    """The single-rank MoE run's norms, computed directly from its weights."""
    (reference,) = run_distributed(_train, 1, args=(MOE_ARGS,), timeout_s=240)
    assert reference["reported"] == pytest.approx(reference["direct"], rel=1e-12)
    return reference["direct"]


@pytest.mark.parametrize("world", sorted(MOE_LAYOUTS))
def test_moe_params_norm_is_the_whole_models_on_every_layout(world):
    expected = _moe_reference()
    assert expected[0] != expected[1]
    for rank in run_distributed(moe_rank_layouts, world, args=(world,), timeout_s=300):
        for name, run in rank.items():
            assert run["reported"] == pytest.approx(expected, rel=RTOL), name


# --- bf16: the optimizer's fp32 main params, as Megatron-LM's calc_params_l2_norm ------------

BF16_ARGS = ARGS + ["--bf16"]


def _main_param_groups(optimizer) -> list:
    """The optimizer's own fp32 copies of the bf16 weights: megatron-core's Float16Optimizer
    keeps them in ``fp32_from_float16_groups``, the distributed optimizer its rank's shards in
    ``shard_fp32_from_float16_groups`` (on one rank: all of them)."""
    groups = []
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        groups += getattr(inner, "shard_fp32_from_float16_groups", None) \
            or getattr(inner, "fp32_from_float16_groups")
    return [param for group in groups for param in group]


def _train_bf16(argv: list[str]) -> dict:
    with stepping_trainer(argv) as (trainer, state, provider):
        reported, main, weights = [], [], []
        for iteration in range(STEPS):
            report = trainer.step(provider.step_batches(iteration))
            reported.append(report.metrics.params_norm)
            main.append(math.sqrt(sum(float(param.detach().double().square().sum())
                                      for param in _main_param_groups(state.optimizer))))
            weights.append(math.sqrt(sum(float(param.detach().double().square().sum())
                                         for chunk in state.model
                                         for param in chunk.parameters())))
        dtypes = {param.dtype for chunk in state.model for param in chunk.parameters()}
        return {"reported": reported, "main": main, "weights": weights, "dtypes": dtypes}


@pytest.mark.parametrize("optimizer", [[], ["--use-distributed-optimizer"]])
def test_bf16_params_norm_is_the_fp32_main_params_norm(optimizer):
    (run,) = run_distributed(_train_bf16, 1, args=(BF16_ARGS + optimizer,), timeout_s=240)
    assert torch.bfloat16 in run["dtypes"]  # a bf16 model: its weights are rounded copies
    assert run["reported"] == pytest.approx(run["main"], rel=1e-12)
    # The bf16 weights' norm is another number: the test tells the two apart.
    assert all(abs(w - m) > 1e-9 * m for w, m in zip(run["weights"], run["main"]))
