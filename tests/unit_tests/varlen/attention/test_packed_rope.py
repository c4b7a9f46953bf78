"""RoPE from one table per micro-batch (packed_rope.py) is megatron-core's THD RoPE bit for bit.

The reference is megatron-core 0.16.1's own ``apply_rotary_pos_emb`` (unfused THD path) on the
same local tokens: outputs and gradients must be EQUAL (torch.equal), not close, in fp32 and
bf16, for CP 1/2/4 and every rank, padded sequences, ``rotary_percent < 1``, interleaved
rotation, YaRN's mscale, GQA head counts and megatron-core's "exact mapping" table. The layer's
choice between the two paths (cp_switching.py) is checked here too; whole-model equality and
the host-work counts are in test_packed_rope_model.py.

Shape legend: T = padded tokens of the pack, T_r = T / cp, H = heads, D = head dim.
"""

from types import SimpleNamespace

import pytest
import torch
from megatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron.varlen.attention.core_attention import VarlenCoreAttention
from megatron.varlen.attention.cp_switching import CPSwitchingSelfAttention
from megatron.varlen.attention.packed_rope import (
    build_packed_rope_table,
    packed_rope_table,
    rope_positions,
    rotate_half,
)
from megatron.varlen.packing.packed_seq import varlen_packed_seq_params

REAL_LENGTHS = [7, 16, 33, 1, 8]
PAD_MULTIPLE = 8  # 2 * the largest CP size
Q_HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16
CP_PLACES = [(1, 0), (2, 0), (2, 1), (4, 0), (4, 1), (4, 2), (4, 3)]
YARN_MSCALE = 1.1386  # a concentration factor != 1, as YaRN gives
VARIANTS = {  # name: (rotary_percent, rotary_interleaved, mscale)
    "plain": (1.0, False, 1.0),
    "partial": (0.5, False, 1.0),
    "interleaved": (1.0, True, 1.0),
    "yarn_mscale": (1.0, False, YARN_MSCALE),
    "all": (0.5, True, YARN_MSCALE),
}


class _Group:
    """The size and rank megatron-core's unfused THD RoPE asks a CP group for."""

    def __init__(self, size, rank):
        self._size, self._rank = size, rank

    def size(self):
        return self._size

    def rank(self):
        return self._rank


@pytest.fixture(autouse=True)
def _tables_on_cpu(monkeypatch):
    """RotaryEmbedding moves its inverse frequencies to ``torch.cuda.current_device()``: here
    that is the CPU, where the tokens are (also on a machine with a GPU)."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: torch.device("cpu"))


def _cu(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def _padded_lengths():
    return [-(-n // PAD_MULTIPLE) * PAD_MULTIPLE for n in REAL_LENGTHS]


def _freqs(rotary_percent, interleaved, rows):
    """megatron-core's frequency table [rows, 1, 1, R] (float32)."""
    rope = RotaryEmbedding(kv_channels=HEAD_DIM, rotary_percent=rotary_percent,
                           rotary_interleaved=interleaved, use_cpu_initialization=True)
    return rope(rows)


def _config(interleaved):
    return TransformerConfig(num_layers=1, hidden_size=Q_HEADS * HEAD_DIM,
                             num_attention_heads=Q_HEADS, num_query_groups=KV_HEADS,
                             rotary_interleaved=interleaved)


def _rotate_both_ways(t, freqs, cu_padded, cp, rank, interleaved, mscale):
    """(megatron-core's result, ours) and the gradients of t through each, same upstream."""
    upstream = torch.randn(t.shape, generator=torch.Generator().manual_seed(7)).to(t)
    leaf_ref, leaf_new = t.clone().requires_grad_(), t.clone().requires_grad_()
    ref = apply_rotary_pos_emb(leaf_ref, freqs, _config(interleaved), cu_seqlens=cu_padded,
                               mscale=mscale, cp_group=_Group(cp, rank))
    table = build_packed_rope_table(freqs, cu_padded, cp, rank, mscale, t.dtype)
    new = table.rotate(leaf_new.unsqueeze(1), interleaved).squeeze(1)
    ref.backward(upstream)
    new.backward(upstream)
    return ref.detach(), new.detach(), leaf_ref.grad, leaf_new.grad


def _tokens(heads, rows, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, heads, HEAD_DIM, generator=gen).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_equals_megatron_core_bit_for_bit(variant, dtype):
    rotary_percent, interleaved, mscale = VARIANTS[variant]
    padded = _padded_lengths()
    cu_padded = _cu(padded)
    freqs = _freqs(rotary_percent, interleaved, max(padded))
    for cp, rank in CP_PLACES:
        local = sum(padded) // cp
        for heads in (Q_HEADS, KV_HEADS):  # q and k of a GQA layer
            t = _tokens(heads, local, dtype, seed=cp * 10 + rank + heads)
            ref, new, grad_ref, grad_new = _rotate_both_ways(t, freqs, cu_padded, cp, rank,
                                                             interleaved, mscale)
            place = f"cp {cp} rank {rank}, {heads} heads"
            assert new.dtype == ref.dtype == dtype
            assert torch.equal(new, ref), f"{place}: output differs"
            assert torch.equal(grad_new, grad_ref), f"{place}: gradient differs"


@pytest.mark.parametrize("cp", [1, 2])
def test_exact_mapping_table_equals_megatron_core(cp):
    """A table with one row per packed token: megatron-core maps each token to its place in the
    whole pack (its case 1); so do we."""
    padded = _padded_lengths()
    cu_padded = _cu(padded)
    freqs = _freqs(1.0, False, sum(padded))
    assert not torch.equal(freqs[:padded[0]], freqs[padded[0]:2 * padded[0]])  # rows differ
    for rank in range(cp):
        t = _tokens(Q_HEADS, sum(padded) // cp, torch.float32, seed=rank)
        ref, new, grad_ref, grad_new = _rotate_both_ways(t, freqs, cu_padded, cp, rank,
                                                         False, 1.0)
        assert torch.equal(new, ref) and torch.equal(grad_new, grad_ref)


def test_rotate_half_pairs_hand_counted():
    """(a, b) -> (-b, a) for megatron-core's pairs: channel i with i + R/2, or 2i with 2i + 1
    (interleaved). Any leading dimensions: [R], and [T_r, 1, H, R] as the layers give it."""
    channels = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    assert rotate_half(channels, False).tolist() == [-4.0, -5.0, -6.0, 1.0, 2.0, 3.0]
    assert rotate_half(channels, True).tolist() == [-2.0, 1.0, -4.0, 3.0, -6.0, 5.0]
    layered = channels.expand(3, 1, 2, 6)
    for interleaved in (False, True):
        assert torch.equal(rotate_half(layered, interleaved),
                           rotate_half(channels, interleaved).expand(3, 1, 2, 6))


def test_positions_follow_the_zigzag_layout_and_count_padding():
    """Hand-counted: sequences padded to 8 and 4 tokens, CP 2 (chunks of 2 and 1 tokens)."""
    cu_padded = _cu([8, 4])
    assert rope_positions(cu_padded, 1, 0).tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3]
    assert rope_positions(cu_padded, 2, 0).tolist() == [0, 1, 6, 7, 0, 3]
    assert rope_positions(cu_padded, 2, 1).tolist() == [2, 3, 4, 5, 1, 2]
    assert rope_positions(cu_padded, 2, 1, exact_mapping=True).tolist() == [2, 3, 4, 5, 9, 10]


def test_table_is_built_once_per_micro_batch_and_dtype():
    padded = _padded_lengths()
    params = varlen_packed_seq_params(_cu(REAL_LENGTHS), _cu(padded), _cu(REAL_LENGTHS),
                                      _cu(padded), max(padded), local_cp_size=None)
    freqs = _freqs(1.0, False, max(padded))
    table = packed_rope_table(params, freqs, 2, 1, 1.0, torch.float32)
    assert packed_rope_table(params, freqs, 2, 1, 1.0, torch.float32) is table  # every layer
    assert packed_rope_table(params, freqs, 2, 1, 1.0, torch.bfloat16) is not table
    assert packed_rope_table(params, freqs, 2, 0, 1.0, torch.float32) is not table
    assert table.cos.shape == (sum(padded) // 2, 1, 1, HEAD_DIM)


# ---- which calls take the one-table path (the rest keep megatron-core's RoPE) ----------------

def _layer(core_attention=None, **config_overrides):
    """What ``_packed_rope_freqs`` reads of a layer."""
    config = dict(no_rope_freq=None, apply_rope_fusion=False, multi_latent_attention=False,
                  mrope_section=None)
    config.update(config_overrides)
    core = core_attention if core_attention is not None else object.__new__(VarlenCoreAttention)
    return SimpleNamespace(config=SimpleNamespace(**config), layer_number=1,
                           core_attention=core, rope_from_one_table=True,
                           offload_qkv_linear=False)


def _arguments(**overrides):
    params = SimpleNamespace(qkv_format="thd")
    arguments = dict(packed_seq_params=params, rotary_pos_emb=torch.zeros(8, 1, 1, HEAD_DIM))
    arguments.update(overrides)
    return arguments


def _takes_one_table(layer, arguments):
    return CPSwitchingSelfAttention._packed_rope_freqs(layer, arguments) is not None


def test_thd_through_our_core_attention_takes_the_one_table_path():
    freqs = torch.zeros(8, 1, 1, HEAD_DIM)
    assert _takes_one_table(_layer(), _arguments())
    assert _takes_one_table(_layer(), _arguments(rotary_pos_emb=(freqs, freqs)))


@pytest.mark.parametrize("case", [
    "te_core_attention", "sbhd", "no_rope", "inference", "rope_fusion", "mla", "mrope",
    "offloaded_qkv", "different_q_and_k_tables", "switched_off", "not_4d_table", "no_rope_emb",
])
def test_everything_else_keeps_megatron_cores_rope(case):
    layer, arguments = _layer(), _arguments()
    if case == "te_core_attention":
        layer = _layer(core_attention=torch.nn.Identity())
    elif case == "sbhd":
        arguments["packed_seq_params"] = SimpleNamespace(qkv_format="sbhd")
    elif case == "no_rope":
        layer.config.no_rope_freq = [1]
    elif case == "inference":
        arguments["inference_context"] = object()
    elif case == "rope_fusion":
        layer.config.apply_rope_fusion = True
    elif case == "mla":
        layer.config.multi_latent_attention = True
    elif case == "mrope":
        layer.config.mrope_section = [2, 2, 4]
    elif case == "offloaded_qkv":
        layer.offload_qkv_linear = True
    elif case == "different_q_and_k_tables":
        arguments["rotary_pos_emb"] = (torch.zeros(8, 1, 1, HEAD_DIM),
                                       torch.zeros(8, 1, 1, HEAD_DIM))
    elif case == "switched_off":
        layer.rope_from_one_table = False
    elif case == "not_4d_table":
        arguments["rotary_pos_emb"] = torch.zeros(8, HEAD_DIM)
    elif case == "no_rope_emb":
        arguments["rotary_pos_emb"] = None
    assert not _takes_one_table(layer, arguments)
