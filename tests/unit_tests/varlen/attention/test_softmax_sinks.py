"""Attention sinks (``--softmax-type off-by-one`` / ``learnable``, megatron-core's
``softmax_type``) in the local attention, against an independent float64 reference.

The reference, per sequence on its real tokens: scaled causal scores, one more column holding
the head's sink logit, softmax, the column dropped (the row's weights then sum below one);
off-by-one is a sink of 0. Checked: outputs and the gradients of Q, K, V and the learnable sink,
THD and SBHD, and CP 2 over gloo (the sink joins every rank's rows). Plus megatron-core's
parameter name, its TP split and checkpoint axis, and the flash backend's refusal.
Shape legend: T = packed padded tokens, N = query heads, G = kv groups, D = head dim.
"""

import math

import pytest
import torch
import torch.distributed as dist
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.enums import AttnMaskType

from megatron.varlen.attention import varlen_attention
from megatron.varlen.attention.flash_attention import FlashVarlenCoreAttention
from megatron.varlen.packing.cp_split import split_thd_for_cp
from tests.harness.multirank import run_distributed
from tests.unit_tests.varlen.attention._reference import (
    HEAD_DIM, NUM_GROUPS, NUM_HEADS, build, cu, make_config,
)

TOLERANCE = 1e-10
REAL = [7, 16, 33, 1, 2, 3]
PADDED = [8, 16, 40, 8, 8, 24]
SCALE = 1.0 / math.sqrt(HEAD_DIM)


def _inputs(seed):
    gen = torch.Generator().manual_seed(seed)
    total = sum(PADDED)
    make = lambda heads: torch.randn(total, heads, HEAD_DIM, generator=gen,  # noqa: E731
                                     dtype=torch.float64)
    sink = torch.randn(NUM_HEADS, generator=gen, dtype=torch.float64)
    return make(NUM_HEADS), make(NUM_GROUPS), make(NUM_GROUPS), make(NUM_HEADS), sink


def _reference(q, k, v, sink):
    """Per sequence: softmax over [scaled causal scores, the head's sink], the sink dropped."""
    out = torch.zeros(q.size(0), NUM_HEADS, HEAD_DIM, dtype=torch.float64)
    start = 0
    for real, pad in zip(REAL, PADDED):
        rows = slice(start, start + real)
        ks, vs = (x[rows].repeat_interleave(NUM_HEADS // NUM_GROUPS, 1) for x in (k, v))
        scores = torch.einsum("qnd,knd->nqk", q[rows], ks) * SCALE
        scores = scores.masked_fill(torch.ones(real, real, dtype=torch.bool).triu(1),
                                    float("-inf"))
        logits = torch.cat([scores, sink[:, None, None].expand(-1, real, 1)], dim=-1)
        out[rows] = torch.einsum("nqk,knd->qnd", logits.softmax(-1)[..., :-1], vs)
        start += pad
    return out


def _out_and_grads(fn, q, k, v, sink, weight):
    q, k, v, sink = (x.detach().clone().requires_grad_() for x in (q, k, v, sink))
    out = fn(q, k, v, sink)
    (out * weight).sum().backward()
    return [out.detach(), q.grad, k.grad, v.grad, sink.grad]


def _local(q, k, v, sink):
    from megatron.varlen.attention import LOCAL_ONLY_CP_GROUP

    return varlen_attention(q, k, v, cu(PADDED), cu(REAL), LOCAL_ONLY_CP_GROUP, True, SCALE,
                            sink_N=sink)


def test_local_attention_with_a_sink_equals_the_reference():
    q, k, v, weight, sink = _inputs(seed=1)
    got = _out_and_grads(_local, q, k, v, sink, weight)
    expected = _out_and_grads(_reference, q, k, v, sink, weight)
    for name, g, e in zip(["out", "dq", "dk", "dv", "dsink"], got, expected):
        assert float((g - e).abs().max()) < TOLERANCE, name
    # the sink takes weight: without it the output is another one
    plain = varlen_attention(q, k, v, cu(PADDED), cu(REAL), build().cp_group, True, SCALE)
    assert float((plain - got[0]).abs().max()) > 0.01


def _params():
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu(REAL), cu_seqlens_kv=cu(REAL),
                           cu_seqlens_q_padded=cu(PADDED), cu_seqlens_kv_padded=cu(PADDED),
                           max_seqlen_q=max(PADDED), max_seqlen_kv=max(PADDED))


@pytest.mark.parametrize("softmax_type", ["off-by-one", "learnable"])
def test_modules_thd_and_sbhd_equal_the_reference(softmax_type):
    module = build(make_config(softmax_type=softmax_type, params_dtype=torch.float64))
    q, k, v, weight, sink = _inputs(seed=2)
    if softmax_type == "learnable":
        with torch.no_grad():
            module.softmax_offset.copy_(sink)
    else:
        sink = torch.zeros(NUM_HEADS, dtype=torch.float64)  # exp(0) = 1 in each denominator
    flat = lambda x: x.reshape(x.size(0), -1)  # noqa: E731
    out = module(q, k, v, None, packed_seq_params=_params()).detach()
    assert float((out - flat(_reference(q, k, v, sink))).abs().max()) < TOLERANCE
    s, b = 16, 3  # sbhd: batch row b holds one 16-token sequence
    sb = lambda x: x[:s * b].reshape(b, s, *x.shape[1:]).transpose(0, 1)  # noqa: E731
    out = module(sb(q), sb(k), sb(v), None).detach()
    cu_rows = torch.arange(b + 1, dtype=torch.int32) * s
    expected = varlen_attention(q[:s * b], k[:s * b], v[:s * b], cu_rows, cu_rows,
                                build().cp_group, True, SCALE, sink_N=sink)
    assert float((out - sb(expected).reshape(s, b, -1)).abs().max()) < TOLERANCE


def test_the_learnable_sink_is_megatron_cores_parameter_split_over_tp():
    module = build(make_config(softmax_type="learnable"))
    names = [name for name, _ in module.named_parameters()]
    assert names == ["softmax_offset"]
    sink = module.softmax_offset
    assert sink.shape == (NUM_HEADS,)  # the heads of this TP rank (TP 1 here)
    assert sink.tensor_model_parallel and sink.partition_dim == 0
    assert [name for name, _ in build(make_config(softmax_type="off-by-one"))
            .named_parameters()] == []
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    state = module.sharded_state_dict(prefix="layer.", metadata={"dp_cp_group": None})
    tensor = state["layer.softmax_offset"]
    assert isinstance(tensor, ShardedTensor) and tensor.global_shape == (NUM_HEADS,)


def test_flash_refuses_a_sink_in_one_line():
    with pytest.raises(ValueError, match="--attention-backend flash has no attention sink.*"
                                         "--attention-backend local"):
        FlashVarlenCoreAttention(make_config(softmax_type="learnable"), 1, AttnMaskType.causal,
                                 pg_collection=build().pg_collection)


def _rank_cp_with_sink():
    group = dist.group.WORLD
    cp, rank = group.size(), group.rank()
    q, k, v, weight, sink = _inputs(seed=3)
    padded = cu(PADDED)
    split = lambda x: split_thd_for_cp(x, padded, cp, rank, seq_dim=0)  # noqa: E731
    expected = _out_and_grads(_reference, q, k, v, sink, weight)
    got = _out_and_grads(
        lambda q, k, v, s: varlen_attention(q, k, v, padded, cu(REAL), group, True, SCALE,
                                            sink_N=s),
        split(q), split(k), split(v), sink, split(weight))
    errors = [float((g - split(e)).abs().max()) for g, e in zip(got[:4], expected[:4])]
    sink_grad = got[4].clone()
    dist.all_reduce(sink_grad)  # each rank's rows give their share of the sink's gradient
    return max(errors + [float((sink_grad - expected[4]).abs().max())])


def test_cp2_over_gloo_equals_the_reference():
    assert max(run_distributed(_rank_cp_with_sink, 2, timeout_s=120)) < TOLERANCE
