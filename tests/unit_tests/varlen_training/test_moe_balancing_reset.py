"""The per-step reset of global_aux_loss's running counts: the same routers reset as
megatron-core resets, and no walk over the model's modules for the runs that keep no counts.

moe_model.reset_global_balancing used to ``getattr`` every module of every model chunk after
every step, a dense model's too. Reference: megatron-core's own per-step reset,
``finalize_model_grads.reset_model_temporary_tensors`` (which our device-side
finalize_model_grads replaces), over the same module tree, for every load-balancing type.
"""

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from megatron.core.distributed.finalize_model_grads import reset_model_temporary_tensors

from megatron.varlen_training.config import MoEConfig
from megatron.varlen_training.moe_model import reset_global_balancing

BALANCING_TYPES = ("aux_loss", "seq_aux_loss", "global_aux_loss", "none")


class _Router(torch.nn.Module):
    """Counts its resets (megatron-core's TopKRouter method name)."""

    def __init__(self):
        super().__init__()
        self.resets = 0

    def reset_global_aux_loss_tracker(self):
        self.resets += 1


class _Chunk(torch.nn.Module):
    """Two layers with a router each, and a count of the walks over its modules."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(
            torch.nn.ModuleDict({"linear": torch.nn.Linear(2, 2), "router": _Router()})
            for _ in range(2))
        self.walks = 0

    def modules(self):
        self.walks += 1
        return super().modules()

    def resets(self) -> list[int]:
        return [layer["router"].resets for layer in self.layers]


def _moe(balancing: str) -> MoEConfig:
    return MoEConfig(
        num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=None,
        moe_shared_expert_intermediate_size=None, moe_layer_freq=1,
        expert_model_parallel_size=1, expert_tensor_parallel_size=1,
        moe_router_load_balancing_type=balancing, moe_aux_loss_coeff=0.01,
        moe_z_loss_coeff=None, moe_router_score_function="softmax",
        moe_router_pre_softmax=False, moe_router_topk_scaling_factor=None,
        moe_token_dispatcher_type="alltoall", moe_router_dtype=None,
        moe_expert_capacity_factor=None)


@pytest.mark.parametrize("balancing", BALANCING_TYPES)
def test_the_routers_megatron_core_resets_are_reset(balancing):
    ours, reference = [_Chunk(), _Chunk()], [_Chunk(), _Chunk()]
    reset_global_balancing(_moe(balancing), ours)
    core_config = SimpleNamespace(moe_router_enable_expert_bias=False,
                                  moe_router_load_balancing_type=balancing)
    reset_model_temporary_tensors(core_config, reference)
    assert [c.resets() for c in ours] == [c.resets() for c in reference]
    assert any(any(c.resets()) for c in ours) == (balancing == "global_aux_loss")


WITHOUT_GLOBAL_COUNTS = [None, *(_moe(b) for b in BALANCING_TYPES if b != "global_aux_loss"),
                         dataclasses.replace(_moe("aux_loss"), moe_aux_loss_coeff=0.0)]


@pytest.mark.parametrize("moe", WITHOUT_GLOBAL_COUNTS)
def test_no_module_walk_without_global_aux_loss(moe):
    chunks = [_Chunk()]
    reset_global_balancing(moe, chunks)
    assert chunks[0].walks == 0
