"""Layout-invariant weight initialisation.

Megatron draws each rank's shard from that rank's RNG stream, so a TP=2 run and a TP=1 run with
the same ``--seed`` start from different weights. To compare layouts as independent launches,
every parameter is instead drawn as a FULL tensor from a generator keyed by ``(seed, canonical
name)`` and each rank keeps its shard. The canonical name does not depend on the layout:
pipeline-local layer indices become global layer numbers, and a tied output layer on the last
pipeline stage is drawn as the word embedding it mirrors.

Rules (Megatron's defaults): matrices ~ N(0, std), output projections of each layer
(``linear_proj``, ``linear_fc2``, Mamba's ``out_proj``) ~ N(0, std / sqrt(m * num_layers)) with
megatron-core's multiplier m (``TransformerConfig.output_layer_init_method``): 2, or 1 in a
hybrid model (``is_hybrid_model``); norm weights 1, or 0 in a norm that stores gamma - 1
(``zero_centered_gamma``, --apply-layernorm-1p); biases 0.
"""

from __future__ import annotations

import hashlib
import math
import re

import torch

from megatron.core import parallel_state
from megatron.varlen.mamba import mamba_parameter_shard

_LAYER_INDEX = re.compile(r"(^|\.)layers\.(\d+)\.")
_SCALED_OUTPUT_PROJECTIONS = ("linear_proj.weight", "linear_fc2.weight")
# Transformer Engine's layer specs fuse the pre-attention/pre-MLP norm into the next linear
# layer, whose norm parameters are ``layer_norm_weight`` / ``layer_norm_bias``.
_NORM_MARKERS = ("layernorm", "norm.weight", "norm.bias", "layer_norm_weight")
_WORD_EMBEDDING = "embedding.word_embeddings.weight"
_TIED_OUTPUT = "output_layer.weight"
_MTP_PREFIX = "mtp."
_SEED_BYTES = 8
# megatron-core's TransformerConfig: output_layer_init_method's std / sqrt(multiplier * layers)
GPT_OUTPUT_MULTIPLIER = 2.0
HYBRID_OUTPUT_MULTIPLIER = 1.0
# A routed expert's parameters: ``...mlp.experts.local_experts.<i>.``; <i> is the index among
# this expert-parallel rank's experts, the canonical name uses the global expert index.
_LOCAL_EXPERT = re.compile(r"(^|\.)experts\.local_experts\.(\d+)\.")


def _name_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:_SEED_BYTES], "little") & ((1 << 63) - 1)


def _global_expert_name(module: torch.nn.Module, name: str) -> str:
    """``name`` with a routed expert's local index replaced by its global one (expert
    parallelism gives rank r experts r * local .. (r + 1) * local - 1)."""
    match = _LOCAL_EXPERT.search(name)
    if match is None:
        return name
    experts = module.get_submodule(name[: match.end() - 1].rsplit(".", 2)[0])
    first = parallel_state.get_expert_model_parallel_rank() * experts.num_local_experts
    return name[: match.start(2)] + str(first + int(match.group(2))) + name[match.end(2):]


def is_expert_parameter(name: str) -> bool:
    """Whether ``name`` is a routed expert's parameter (sharded over expert TP, not TP)."""
    return _LOCAL_EXPERT.search(name) is not None


def canonical_parameter_name(module: torch.nn.Module, name: str, tied_output: bool) -> str:
    """The layout-free name of a parameter of a GPTModel chunk."""
    if tied_output and name == _TIED_OUTPUT:
        return _WORD_EMBEDDING
    name = _global_expert_name(module, name)
    if name.startswith(_MTP_PREFIX):  # MTP layers live on the last stage, never renumbered
        return name
    match = _LAYER_INDEX.search(name)
    if match is None:
        return name
    owner = module
    for part in name[: match.end() - 1].split("."):
        owner = owner[int(part)] if part.isdigit() else getattr(owner, part)
    global_index = owner.layer_number - 1  # megatron's layer_number is global and 1-based
    return name[: match.start(2)] + str(global_index) + name[match.end(2):]


def _full_shape(param: torch.Tensor, tp_size: int) -> tuple[list[int], int | None]:
    shape = list(param.shape)
    if not getattr(param, "tensor_model_parallel", False) or tp_size == 1:
        return shape, None
    dim = param.partition_dim
    shape[dim] *= tp_size
    return shape, dim


def _draw(name: str, shape: list[int], seed: int, std: float, output_std: float,
          zero_centered: bool = False) -> torch.Tensor:
    if name.endswith(".bias") or name.endswith("_bias"):
        return torch.zeros(shape)
    if any(marker in name for marker in _NORM_MARKERS) and len(shape) == 1:
        return torch.zeros(shape) if zero_centered else torch.ones(shape)
    if name.endswith(_SCALED_OUTPUT_PROJECTIONS):
        std = output_std
    generator = torch.Generator().manual_seed(_name_seed(seed, name))
    return torch.randn(shape, generator=generator, dtype=torch.float64).mul_(std).float()


def _shard(full: torch.Tensor, dim: int | None, tp_size: int, tp_rank: int, gated: bool):
    if dim is None:
        return full
    if gated:
        # Gated MLP (SwiGLU) fc1 keeps [gate_r; up_r] on each rank, not a contiguous slice.
        gate, up = full.chunk(2, dim=dim)
        return torch.cat([gate.chunk(tp_size, dim)[tp_rank], up.chunk(tp_size, dim)[tp_rank]], dim)
    return full.chunk(tp_size, dim=dim)[tp_rank]


def tensor_parallel_shard(name: str) -> tuple[int, int]:
    """(size, rank) of the group that shards parameter ``name``: expert TP for routed experts,
    TP for everything else."""
    if is_expert_parameter(name):
        return (parallel_state.get_expert_tensor_parallel_world_size(),
                parallel_state.get_expert_tensor_parallel_rank())
    return (parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_tensor_model_parallel_rank())


def output_layer_std(std: float, num_layers: int, hybrid: bool) -> float:
    """megatron-core's ``scaled_init_method_normal`` std of the layers' output projections:
    ``std / sqrt(m * num_layers)``, m = 1 in a hybrid model (``is_hybrid_model``), else 2."""
    multiplier = HYBRID_OUTPUT_MULTIPLIER if hybrid else GPT_OUTPUT_MULTIPLIER
    return std / math.sqrt(multiplier * num_layers)


def stores_gamma_minus_one(chunk: torch.nn.Module, name: str) -> bool:
    """Whether the module owning parameter ``name`` is a norm storing gamma - 1 (ours, and
    megatron-core's / Transformer Engine's norms, name the attribute ``zero_centered_gamma``;
    the Mamba mixer's gated norm has none: its weight stays gamma)."""
    owner = chunk.get_submodule(name.rpartition(".")[0])
    return bool(getattr(owner, "zero_centered_gamma", False))


@torch.no_grad()
def initialize_layout_invariant(chunks: list[torch.nn.Module], seed: int, std: float,
                                num_layers: int, tied_output: bool, gated_mlp: bool,
                                hybrid: bool = False) -> None:
    """Overwrites every parameter of the (unwrapped) model chunks in place; ``hybrid``: the
    chunks are a hybrid Mamba model's (output projections as megatron-core's MambaModel)."""
    output_std = output_layer_std(std, num_layers, hybrid)
    for chunk in chunks:
        for name, param in chunk.named_parameters():
            canonical = canonical_parameter_name(chunk, name, tied_output)
            tp_size, tp_rank = tensor_parallel_shard(name)
            mamba = mamba_parameter_shard(chunk, name, canonical, param,
                                          lambda key: _name_seed(seed, key), std, output_std,
                                          tp_size, tp_rank)
            if mamba is not None:  # Mamba mixer: its own rules and sectioned TP shards
                param.copy_(mamba.to(param.dtype))
                continue
            shape, dim = _full_shape(param, tp_size)
            full = _draw(canonical, shape, seed, std, output_std, stores_gamma_minus_one(
                chunk, name))
            gated = gated_mlp and "linear_fc1" in canonical
            param.copy_(_shard(full, dim, tp_size, tp_rank, gated).to(param.dtype))
