"""The common optimizer state converted between EP 1's single optimizer and EP > 1's dense and
expert chain (checkpoint/optimizer_nesting.py), on the shapes megatron-core 0.16.1 saves
(FP32Optimizer: ``param_groups`` and ``state.common_step`` at the top; the distributed
optimizer: ``optimizer.param_groups`` with a ``step``, and its format). The converted groups
must be what megatron-core's own loads accept: its ``_filter_and_reorder_param_groups`` (the
plain optimizers) matches them to this run's groups. The resumes themselves (== the straight
run) are in test_moe_checkpoint.py."""

import copy

import pytest
import torch
from megatron.core.optimizer.optimizer import MegatronOptimizer

from megatron.varlen_training.checkpoint.optimizer_nesting import convert
from megatron.varlen_training.errors import CheckpointError

SAVED_WITH = {"singleton_local_shards": False, "chained_optim_avoid_prefix": True}
FULLY_RESHARDABLE = {**SAVED_WITH, "distrib_optim_sharding_type": "fully_reshardable"}


def _group(wd_mult: float, expert: bool, **extra) -> dict:
    """A param group as megatron-core's _get_param_groups makes it, with torch Adam's keys."""
    return {"wd_mult": wd_mult, "lr_mult": 1.0, "is_expert_parallel": expert,
            "is_decoupled_lr": False, "weight_decay": 0.01 * wd_mult, "lr": 1e-3,
            "max_lr": 2e-3, "min_lr": 0.0, "default_config": True, "betas": (0.9, 0.999),
            "eps": 1e-8, **extra}


DENSE = [_group(1.0, False), _group(0.0, False)]  # weights, then biases / norms (no decay)
EXPERT = [_group(1.0, True)]  # the experts' weights (no biases: --disable-bias-linear)


def _plain(groups: list[dict]) -> dict:
    return {"param_groups": copy.deepcopy(groups),
            "state": {"common_step": torch.tensor(2.0)}}


def _distributed(groups: list[dict]) -> dict:
    return {"optimizer": {"param_groups": [dict(g, step=2.0) for g in groups]},
            "param_state_sharding_type": "fully_reshardable"}


def _accepted_by_megatron_core(target: list[dict], converted: list[dict]) -> list[dict]:
    """megatron-core's own match of loaded groups to this run's (FP32Optimizer and
    Float16OptimizerWithFloat16Params.load_state_dict); it raises where a group is missing."""
    with_params = [dict(group, params=[index]) for index, group in enumerate(converted)]
    return MegatronOptimizer._filter_and_reorder_param_groups(target, with_params)


def test_ep1_splits_into_the_dense_and_the_expert_optimizer():
    saved = _plain(DENSE)
    got = convert(saved, [DENSE, EXPERT], SAVED_WITH)
    assert sorted(got) == [0, 1]
    for index, target in enumerate((DENSE, EXPERT)):
        groups = _accepted_by_megatron_core(target, got[index]["param_groups"])
        assert [g["is_expert_parallel"] for g in groups] == [g["is_expert_parallel"]
                                                            for g in target]
        assert torch.equal(got[index]["state"]["common_step"], torch.tensor(2.0))
    # The expert group is the saved group of its key, re-marked: its hyperparameters are those.
    assert {k: v for k, v in got[1]["param_groups"][0].items() if k != "is_expert_parallel"} \
        == {k: v for k, v in DENSE[0].items() if k != "is_expert_parallel"}


def test_ep2_merges_into_one_optimizer():
    saved = {0: _distributed(DENSE), 1: _distributed(EXPERT)}
    got = convert(saved, [DENSE], FULLY_RESHARDABLE)
    assert set(got) == {"optimizer", "param_state_sharding_type"}
    groups = got["optimizer"]["param_groups"]
    assert groups == [dict(g, step=2.0) for g in DENSE]
    _accepted_by_megatron_core(DENSE, groups)


def test_the_same_nesting_is_left_to_megatron_core():
    saved = {0: _plain(DENSE), 1: _plain(EXPERT)}
    assert convert(saved, [DENSE, EXPERT], SAVED_WITH) is saved


def test_merged_optimizers_must_agree_besides_their_groups():
    """Each chained optimizer has its own grad scaler; two different ones cannot become one."""
    dense, expert = _plain(DENSE), _plain(EXPERT)
    dense["grad_scaler"], expert["grad_scaler"] = {"scale": 1024.0}, {"scale": 512.0}
    with pytest.raises(CheckpointError, match="--no-load-optim"):
        convert({0: dense, 1: expert}, [DENSE], SAVED_WITH)


def test_merged_groups_must_agree_besides_the_expert_mark():
    expert = _distributed(EXPERT)
    expert["optimizer"]["param_groups"][0]["step"] = 1.0
    with pytest.raises(CheckpointError, match="differ besides the expert mark"):
        convert({0: _distributed(DENSE), 1: expert}, [DENSE], FULLY_RESHARDABLE)


def test_a_group_the_checkpoint_lacks_is_one_line():
    decoupled = [_group(1.0, False, is_decoupled_lr=True)]
    with pytest.raises(CheckpointError) as err:
        convert(_plain(DENSE), [DENSE + decoupled, EXPERT], SAVED_WITH)
    assert "\n" not in str(err.value) and "is_decoupled_lr True" in str(err.value)


@pytest.mark.parametrize("metadata, words", [
    (None, "saved before its optimizer format was stored"),  # LEGACY_METADATA's type only
    ({**SAVED_WITH, "distrib_optim_sharding_type": "dp_reshardable"}, "dp_reshardable format"),
])
def test_tensors_not_keyed_by_parameter_are_refused(metadata, words):
    metadata = metadata or {"distrib_optim_sharding_type": "dp_reshardable"}
    with pytest.raises(CheckpointError, match=words):
        convert(_plain(DENSE), [DENSE, EXPERT], metadata)
