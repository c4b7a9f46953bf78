"""Context-parallel core attention on gloo ranks: CP=2 and CP=4, THD and SBHD, static and
per-micro-batch groups, and the no-collective guarantee for single-rank groups.

Every check compares the CP run with the single-rank run on the same full inputs, restricted
to this rank's slice: outputs and the gradients of Q, K and V.
Shape legend: T = packed padded tokens, S = sbhd sequence length, b = batch.
"""

import pytest
import torch
import torch.distributed as dist
from megatron.core.packed_seq_params import PackedSeqParams

from megatron.varlen.packing.cp_split import split_sbhd_for_cp, split_thd_for_cp
from tests.harness.collectives import forbid_collectives
from tests.harness.multirank import run_distributed
from tests.unit_tests.varlen.attention._reference import (
    HEAD_DIM,
    NUM_GROUPS,
    NUM_HEADS,
    build,
    packed_inputs,
)

CP_PAD_MULTIPLE = 8  # 2 * cp for cp 4 (and a multiple of 4 for cp 2)
SBHD_SEQ, SBHD_BATCH = 16, 2
TOLERANCE = 1e-10


def _run(module, inputs, weight, params):
    """Output and input grads of ``sum(module(*inputs) * weight)``."""
    inputs = [x.detach().clone().requires_grad_() for x in inputs]
    out = module(*inputs, None, packed_seq_params=params)
    (out * weight).sum().backward()
    return [out.detach()] + [x.grad for x in inputs]


def _max_error(got, expected):
    return max(float((g - e).abs().max()) for g, e in zip(got, expected))


def _check_thd(group, dynamic):
    q, k, v, params, _ = packed_inputs(seed=5, pad_multiple=CP_PAD_MULTIPLE)
    weight = torch.randn(q.size(0), NUM_HEADS * HEAD_DIM, dtype=torch.float64,
                         generator=torch.Generator().manual_seed(6))
    full = _run(build(), (q, k, v), weight, params)
    cu_padded, cp, rank = params.cu_seqlens_q_padded, group.size(), group.rank()
    split = lambda x: split_thd_for_cp(x, cu_padded, cp, rank, seq_dim=0)
    if dynamic:  # static group is single-rank, the micro-batch brings the CP group
        module = build()
        params.cp_group, params.local_cp_size = group, cp
    else:
        module = build(cp_group=group)
    local = _run(module, [split(x) for x in (q, k, v)], split(weight), params)
    return _max_error(local, [split(x) for x in full])


def _check_sbhd(group, via_params):
    gen = torch.Generator().manual_seed(7)
    shapes = [(SBHD_SEQ, SBHD_BATCH, h, HEAD_DIM) for h in (NUM_HEADS, NUM_GROUPS, NUM_GROUPS)]
    q, k, v = (torch.randn(*s, generator=gen, dtype=torch.float64) for s in shapes)
    weight = torch.randn(SBHD_SEQ, SBHD_BATCH, NUM_HEADS * HEAD_DIM, generator=gen,
                         dtype=torch.float64)
    full = _run(build(), (q, k, v), weight, None)
    split = lambda x: split_sbhd_for_cp(x, group.size(), group.rank(), seq_dim=0)
    if via_params:  # megatron-core's hybrid-CP convention: sbhd PackedSeqParams with a group
        module = build()
        params = PackedSeqParams(qkv_format="sbhd", cp_group=group, local_cp_size=group.size())
    else:
        module, params = build(cp_group=group), None
    local = _run(module, [split(x) for x in (q, k, v)], split(weight), params)
    return _max_error(local, [split(x) for x in full])


def rank_cp_equivalence():
    groups = {dist.get_world_size(): dist.group.WORLD}
    if dist.get_world_size() == 4:
        groups[2], _ = dist.new_subgroups(group_size=2)
    errors = {}
    for cp, group in groups.items():
        errors[f"thd-dynamic-cp{cp}"] = _check_thd(group, dynamic=True)
        errors[f"thd-static-cp{cp}"] = _check_thd(group, dynamic=False)
        errors[f"sbhd-static-cp{cp}"] = _check_sbhd(group, via_params=False)
        errors[f"sbhd-params-cp{cp}"] = _check_sbhd(group, via_params=True)
    return errors


def rank_single_rank_groups_make_no_collective():
    """local_cp_size 1 (a real size-1 group, or no group at all) on a static CP=world module."""
    size_one_group, _ = dist.new_subgroups(group_size=1)
    calls = []
    forbid_collectives(calls)
    q, k, v, params, _ = packed_inputs(seed=8)
    weight = torch.ones(q.size(0), NUM_HEADS * HEAD_DIM, dtype=torch.float64)
    expected = _run(build(), (q, k, v), weight, params)
    errors = {}
    for name, group in (("size-1 group", size_one_group), ("local_cp_size=1, no group", None)):
        params.cp_group, params.local_cp_size = group, 1
        got = _run(build(cp_group=dist.group.WORLD), (q, k, v), weight, params)
        errors[name] = _max_error(got, expected)
    return errors, calls


@pytest.fixture(scope="module")
def cp4_errors():
    return run_distributed(rank_cp_equivalence, world_size=4, timeout_s=120)


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("case", ["thd-dynamic", "thd-static", "sbhd-static", "sbhd-params"])
def test_cp_matches_single_rank_on_the_slice(cp4_errors, cp, case):
    for rank_errors in cp4_errors:
        assert rank_errors[f"{case}-cp{cp}"] < TOLERANCE


def test_single_rank_groups_make_no_collective():
    for errors, calls in run_distributed(rank_single_rank_groups_make_no_collective, 2,
                                         timeout_s=60):
        assert calls == []
        assert max(errors.values()) < TOLERANCE, errors

