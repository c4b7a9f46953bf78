"""Pieces shared by the RoPE-path tests and tools/rope_host_overhead.py: a tiny packed GPT with
RoPE, the switch between RoPE from one table per micro-batch and megatron-core's own RoPE, a
fixed-cost stand-in for the varlen attention kernel and an aten-op counter.

Run inside an initialised ``parallel_state`` (a rank of tests/harness/multirank.py).
"""

from __future__ import annotations

from collections import Counter

import torch
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.transformer.transformer_config import TransformerConfig
from torch.utils._python_dispatch import TorchDispatchMode

from megatron.varlen.attention.cp_switching import CPSwitchingSelfAttention
from megatron.varlen.model.spec import get_varlen_gpt_layer_spec
from megatron.varlen.packing.packed_seq import VarlenPackedSeqParams, varlen_packed_seq_params

YARN_SCALING_FACTOR = 4.0  # YaRN's mscale is then 0.1 * ln(4) + 1 != 1
SCALAR_READ = "aten._local_scalar_dense"  # what .item() / bool() of a tensor dispatch


def build_gpt(layers: int, hidden: int, heads: int, kv_groups: int, vocab: int, max_len: int,
              seed: int, rotary_percent: float = 1.0, yarn: bool = False,
              qk_layernorm: bool = False, attention_backend: str | None = None,
              **config_overrides) -> GPTModel:
    """A float32 GPTModel with RoPE on our local spec, identical weights for the same seed.
    ``yarn``: the attention layers use YaRN's mscale (megatron-core reads it from the config)."""
    torch.manual_seed(seed)
    config = TransformerConfig(
        num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
        num_query_groups=kv_groups, ffn_hidden_size=2 * hidden, hidden_dropout=0.0,
        attention_dropout=0.0, use_cpu_initialization=True, params_dtype=torch.float32,
        qk_layernorm=qk_layernorm, **config_overrides)
    if yarn:
        config.yarn_rotary_scaling_factor = YARN_SCALING_FACTOR
    spec = get_varlen_gpt_layer_spec(qk_layernorm=qk_layernorm, use_te=False,
                                     attention_backend=attention_backend)
    return GPTModel(config, spec, vocab_size=vocab, max_sequence_length=max_len,
                    position_embedding_type="rope", rotary_percent=rotary_percent)


def use_one_table(model: torch.nn.Module, on: bool) -> None:
    """RoPE from one table per micro-batch (True) or megatron-core's own (False), every layer."""
    layers = [m for m in model.modules() if isinstance(m, CPSwitchingSelfAttention)]
    if not layers:
        raise ValueError("the model has no CPSwitchingSelfAttention layer")
    for layer in layers:
        layer.rope_from_one_table = on


def fixed_cost_kernel(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None,
                      window_size=None, enable_gqa=False):
    """Stands in for the GPU's ONE varlen attention kernel call (``varlen_attn``'s signature):
    a fixed number of ops whatever the boundaries, where the CPU twin loops over sequences.
    Its numbers mean nothing; it isolates what the layer dispatches around the kernel."""
    return query * (key.sum() + value.sum())


def use_fixed_cost_kernel(model: torch.nn.Module) -> None:
    """Every flash core attention of ``model`` calls :func:`fixed_cost_kernel`."""
    for layer in model.modules():
        if isinstance(layer, CPSwitchingSelfAttention):
            layer.core_attention.kernel = fixed_cost_kernel


class CountOps(TorchDispatchMode):
    """Counts the aten ops dispatched inside the mode (forward and, on CPU, backward)."""

    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def equal_pack(sequences: int, tokens: int, cp_size: int = 1,
               cp_group=None) -> VarlenPackedSeqParams:
    """THD params of a pack of ``sequences`` sequences of ``tokens / sequences`` tokens each
    (no padding), as the packing layer makes them; ``cp_group``: split over that group."""
    lengths = [tokens // sequences] * sequences
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return varlen_packed_seq_params(cu, cu, cu, cu, max(lengths),
                                    local_cp_size=None if cp_group is None else cp_size,
                                    cp_group=cp_group)


def layer_ops(layer: torch.nn.Module, freqs: torch.Tensor, params, tokens: int,
              hidden_size: int) -> Counter:
    """The aten ops of one attention layer's forward + backward on ``tokens`` local tokens,
    counted on a second call: the first built the micro-batch's plan and RoPE table (once per
    micro-batch, not per layer)."""
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(tokens, 1, hidden_size, generator=gen).requires_grad_()

    def step():
        out, _ = layer(hidden, None, rotary_pos_emb=freqs, packed_seq_params=params)
        out.sum().backward()

    step()
    counter = CountOps()
    with counter:
        step()
    return counter.ops
