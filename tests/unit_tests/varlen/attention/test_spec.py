"""The layer spec, the pinned megatron-core protocol, and per-micro-batch CP-group switching.

Shape legend: T = packed padded tokens, h = hidden size.
"""

import inspect

import pytest
import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.attention import CoreAttention, CoreAttentionBuilder
from megatron.core.transformer.spec_utils import build_module

from megatron.varlen.attention import (
    LOCAL_ONLY_CP_GROUP,
    CPSwitchingSelfAttention,
    VarlenCoreAttention,
    get_te_core_attention,
    resolve_cp_group,
    swap_attributes,
)
from megatron.varlen.packing.cp_split import split_thd_for_cp
from megatron.varlen.model.norms import VarlenNorm
from megatron.varlen.model.spec import get_varlen_gpt_layer_spec, get_varlen_mtp_block_spec
from tests.harness.multirank import run_distributed
from tests.unit_tests.varlen.attention._reference import (
    HEAD_DIM,
    NUM_HEADS,
    make_config,
    packed_inputs,
)

LAYER_TOLERANCE = 1e-5  # fp32 layer, different reduction order with and without CP
SBHD_LOCAL_SEQ = 6


class _FakeGroup:
    def __init__(self, size):
        self._size = size

    def size(self):
        return self._size

    def rank(self):
        return 0


# ---------------------------------------------------------------- single process


def test_core_attention_matches_the_upstream_protocol():
    """Pins megatron-core's CoreAttentionBuilder/CoreAttention: a bump that changes them fails."""
    builder = inspect.signature(CoreAttentionBuilder.__call__).parameters
    ours = inspect.signature(VarlenCoreAttention.__init__).parameters
    assert set(builder) - {"self"} <= set(ours)
    upstream_forward = [p for p in inspect.signature(CoreAttention.forward).parameters]
    our_forward = [p for p in inspect.signature(VarlenCoreAttention.forward).parameters]
    assert our_forward == upstream_forward


def test_spec_swaps_only_attention_class_and_core_attention():
    ours, base = get_varlen_gpt_layer_spec(), get_gpt_layer_local_spec()
    attention = ours.submodules.self_attention
    assert attention.module is CPSwitchingSelfAttention
    assert attention.submodules.core_attention is VarlenCoreAttention
    assert attention.params == base.submodules.self_attention.params
    for slot in ("linear_qkv", "linear_proj", "q_layernorm", "k_layernorm"):
        assert getattr(attention.submodules, slot) is getattr(
            base.submodules.self_attention.submodules, slot)
    for slot in ("self_attn_bda", "mlp_bda"):
        assert getattr(ours.submodules, slot) is getattr(base.submodules, slot)
    # The local spec's torch norms refuse sequence parallel: ours are the SP-capable twin.
    for slot in ("input_layernorm", "pre_mlp_layernorm"):
        assert getattr(ours.submodules, slot) is VarlenNorm
    assert ours.submodules.mlp.module is base.submodules.mlp.module


def test_gpu_adapter_is_absent_on_cpu_and_use_te_true_fails_clearly():
    assert get_te_core_attention() is None
    with pytest.raises(ValueError, match="use_te=True"):
        get_varlen_gpt_layer_spec(use_te=True)


def test_resolve_cp_group_rules():
    static, dynamic = _FakeGroup(4), _FakeGroup(2)
    params = type("P", (), {"cp_group": None, "local_cp_size": None})
    assert resolve_cp_group(None, static) is static
    assert resolve_cp_group(params(), static) is static
    p = params(); p.cp_group, p.local_cp_size = dynamic, 2
    assert resolve_cp_group(p, static) is dynamic
    p = params(); p.local_cp_size = 1
    assert resolve_cp_group(p, static) is LOCAL_ONLY_CP_GROUP
    p = params(); p.cp_group, p.local_cp_size = dynamic, 4
    with pytest.raises(ValueError, match="local_cp_size=4"):
        resolve_cp_group(p, static)
    p = params(); p.local_cp_size = 2
    with pytest.raises(ValueError, match="needs packed_seq_params.cp_group"):
        resolve_cp_group(p, static)


def test_swap_attributes_restores_on_exception():
    a, b = type("O", (), {})(), type("O", (), {})()
    a.x, b.y = 1, 2
    with pytest.raises(RuntimeError):
        with swap_attributes([(a, "x", 10), (b, "y", 20)]):
            assert (a.x, b.y) == (10, 20)
            raise RuntimeError("boom")
    assert (a.x, b.y) == (1, 2)
    with pytest.raises(AttributeError):  # a failing assignment still restores the earlier ones
        with swap_attributes([(a, "x", 10), (b, "missing", 0)]):
            pass
    assert a.x == 1


# ---------------------------------------------------------------- gloo ranks


def _build_layer(seed):
    torch.manual_seed(seed)
    cfg = make_config(use_cpu_initialization=True, ffn_hidden_size=2 * NUM_HEADS * HEAD_DIM,
                      context_parallel_size=parallel_state.get_context_parallel_world_size())
    return build_module(get_varlen_gpt_layer_spec(), config=cfg, layer_number=1), cfg


def _layer_thd_error(layer):
    """Static CP=2 THD layer forward (with RoPE) == local_cp_size=1 forward on the full pack."""
    _, _, _, params, _ = packed_inputs(pad_multiple=4)
    hidden = torch.randn(int(params.cu_seqlens_q_padded[-1]), 1, NUM_HEADS * HEAD_DIM,
                         generator=torch.Generator().manual_seed(9))
    rope = RotaryEmbedding(kv_channels=HEAD_DIM, rotary_percent=1.0)(
        params.max_seqlen_q, packed_seq=True)
    params.local_cp_size = 1  # CP off for this micro-batch although the static group has 2
    full, _ = layer(hidden, attention_mask=None, rotary_pos_emb=rope, packed_seq_params=params)
    params.local_cp_size = None
    cu, group = params.cu_seqlens_q_padded, parallel_state.get_context_parallel_group()
    split = lambda x: split_thd_for_cp(x, cu, group.size(), group.rank(), seq_dim=0)
    local, _ = layer(split(hidden), attention_mask=None, rotary_pos_emb=rope,
                     packed_seq_params=params)
    return float((local - split(full)).detach().abs().max())


def _exception_leaves_static_group(layer):
    attention, static = layer.self_attention, parallel_state.get_context_parallel_group()
    original_pgs = attention.pg_collection
    dynamic, _ = dist.new_subgroups(group_size=1)
    seen = {}

    def failing_forward(*args, **kwargs):
        seen["rope_group"] = attention.pg_collection.cp
        seen["core_group"] = attention.core_attention.cp_group
        raise RuntimeError("injected failure inside core attention")

    _, _, _, params, _ = packed_inputs(pad_multiple=4)
    params.cp_group, params.local_cp_size = dynamic, 1
    attention.core_attention.forward = failing_forward
    hidden = torch.randn(int(params.cu_seqlens_q_padded[-1]), 1, NUM_HEADS * HEAD_DIM)
    try:
        layer(hidden, attention_mask=None, packed_seq_params=params)
    except RuntimeError as error:
        assert "injected failure" in str(error)
    else:
        raise AssertionError("the injected failure did not propagate")
    finally:
        del attention.core_attention.forward
    return {
        "switched_inside": seen["rope_group"] is dynamic and seen["core_group"] is dynamic,
        "restored_after": attention.pg_collection is original_pgs
        and original_pgs.cp is static and attention.core_attention.cp_group is static,
    }


def _mtp_spec_uses_our_layer():
    layer_spec = get_varlen_gpt_layer_spec()
    block = get_varlen_mtp_block_spec(make_config(mtp_num_layers=1), layer_spec)
    return block.layer_specs[0].submodules.transformer_layer is layer_spec


def rank_layer_checks():
    parallel_state.initialize_model_parallel(context_parallel_size=2)
    try:
        layer, _ = _build_layer(seed=11)
        sbhd_out, _ = layer(torch.randn(SBHD_LOCAL_SEQ, 2, NUM_HEADS * HEAD_DIM),
                            attention_mask=None)
        return {
            "types": (type(layer.self_attention).__name__,
                      type(layer.self_attention.core_attention).__name__),
            "sbhd_shape": tuple(sbhd_out.shape),
            "thd_error": _layer_thd_error(layer),
            **_exception_leaves_static_group(layer),
            "mtp_spec": _mtp_spec_uses_our_layer(),
        }
    finally:
        parallel_state.destroy_model_parallel()


@pytest.fixture(scope="module")
def layer_results():
    return run_distributed(rank_layer_checks, world_size=2, timeout_s=120)


def test_layer_builds_from_spec_and_runs_sbhd(layer_results):
    for result in layer_results:
        assert result["types"] == ("CPSwitchingSelfAttention", "VarlenCoreAttention")
        assert result["sbhd_shape"] == (SBHD_LOCAL_SEQ, 2, NUM_HEADS * HEAD_DIM)


def test_layer_thd_static_cp_equals_local_cp_size_one(layer_results):
    for result in layer_results:
        assert result["thd_error"] < LAYER_TOLERANCE


def test_switching_uses_the_micro_batch_group_and_restores_on_exception(layer_results):
    for result in layer_results:
        assert result["switched_inside"]
        assert result["restored_after"]


def test_mtp_block_spec_reuses_the_varlen_layer(layer_results):
    assert all(result["mtp_spec"] for result in layer_results)
