"""Which Hugging Face tensors make each megatron-core parameter, and how TP shards them.

A parameter is named by its layout-free (canonical) name (``layout_invariant_init.canonical_parameter_name``:
global layer numbers, a tied output layer named as the word embedding). Each name matches one
:class:`Rule`, whose ``kind`` says how the HF tensors combine and split over TP ranks:

- ``replicated``: every rank holds the whole HF tensor (the MoE router).
- ``norm``: a norm's weight, replicated; a norm that stores gamma - 1 (``--apply-layernorm-1p``)
  holds the HF weight minus 1, so import subtracts 1 and export adds it back.
- ``vocab``: embedding / output layer, rows split over TP; megatron's padded rows (beyond the
  HF vocabulary) are zero on import and dropped on export.
- ``row``: a row-parallel linear layer (o_proj, down_proj), split by input columns.
- ``qkv``: megatron fuses q, k, v per query group, ``[q heads of group g..., k_g, v_g]`` for each
  group g, and TP ranks hold whole groups (megatron-core's ``get_query_key_value_tensors``).
- ``gated``: the SwiGLU fc1 holds ``[gate_r; up_r]`` on TP rank r (each half split over TP).

``local_shard`` reads only the rows/columns one TP rank needs (through a ``read(name, rows,
cols)`` callable, e.g. a safetensors slice); ``hf_tensors`` turns full (TP-gathered) megatron
tensors back into HF tensors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import torch

from megatron.varlen_training.hf.config import HFModelConfig

# read(hf_name, rows, cols) -> tensor; rows/cols are (start, stop) or None for all.
Reader = Callable[[str, "tuple[int, int] | None", "tuple[int, int] | None"], torch.Tensor]

_LAYER = r"decoder\.layers\.(\d+)\."
_HF_LAYER = "model.layers.{}."
_EXPERT = r"mlp\.experts\.local_experts\.(\d+)\."
_HF_EXPERT = _HF_LAYER + "mlp.experts.{}."
ZERO_CENTERED_OFFSET = 1.0  # a zero-centered norm scales by its stored weight + 1


@dataclass(frozen=True)
class Rule:
    pattern: re.Pattern
    kind: str
    hf_names: tuple[str, ...]  # format strings taking the global layer (and expert) index


def _rule(pattern: str, kind: str, *hf_names: str) -> Rule:
    return Rule(re.compile(pattern + "$"), kind, hf_names)


RULES = (
    _rule(r"embedding\.word_embeddings\.weight", "vocab", "model.embed_tokens.weight"),
    _rule(r"output_layer\.weight", "vocab", "lm_head.weight"),
    _rule(r"decoder\.final_layernorm\.weight", "norm", "model.norm.weight"),
    _rule(_LAYER + r"input_layernorm\.weight", "norm",
          _HF_LAYER + "input_layernorm.weight"),
    _rule(_LAYER + r"self_attention\.linear_qkv\.weight", "qkv",
          *(_HF_LAYER + f"self_attn.{p}_proj.weight" for p in "qkv")),
    _rule(_LAYER + r"self_attention\.linear_qkv\.bias", "qkv",
          *(_HF_LAYER + f"self_attn.{p}_proj.bias" for p in "qkv")),
    _rule(_LAYER + r"self_attention\.q_layernorm\.weight", "norm",
          _HF_LAYER + "self_attn.q_norm.weight"),
    _rule(_LAYER + r"self_attention\.k_layernorm\.weight", "norm",
          _HF_LAYER + "self_attn.k_norm.weight"),
    _rule(_LAYER + r"self_attention\.linear_proj\.weight", "row",
          _HF_LAYER + "self_attn.o_proj.weight"),
    _rule(_LAYER + r"pre_mlp_layernorm\.weight", "norm",
          _HF_LAYER + "post_attention_layernorm.weight"),
    _rule(_LAYER + r"mlp\.linear_fc1\.weight", "gated",
          _HF_LAYER + "mlp.gate_proj.weight", _HF_LAYER + "mlp.up_proj.weight"),
    _rule(_LAYER + r"mlp\.linear_fc2\.weight", "row", _HF_LAYER + "mlp.down_proj.weight"),
    # Qwen3-MoE: the router ("gate") and each routed expert by its GLOBAL index (the canonical
    # name, whatever the expert parallelism).
    _rule(_LAYER + r"mlp\.router\.weight", "replicated", _HF_LAYER + "mlp.gate.weight"),
    _rule(_LAYER + _EXPERT + r"linear_fc1\.weight", "gated",
          _HF_EXPERT + "gate_proj.weight", _HF_EXPERT + "up_proj.weight"),
    _rule(_LAYER + _EXPERT + r"linear_fc2\.weight", "row", _HF_EXPERT + "down_proj.weight"),
    # Transformer Engine layer specs (GPU) fuse the pre-attention/pre-MLP norms into the next
    # linear layer; same HF tensors. Untested here: no GPU was available to this project.
    _rule(_LAYER + r"self_attention\.linear_qkv\.layer_norm_weight", "norm",
          _HF_LAYER + "input_layernorm.weight"),
    _rule(_LAYER + r"mlp\.linear_fc1\.layer_norm_weight", "norm",
          _HF_LAYER + "post_attention_layernorm.weight"),
)


class UnmappedParameterError(ValueError):
    """A megatron parameter without a Hugging Face counterpart."""


def match(canonical_name: str) -> tuple[Rule, list[str]]:
    """The rule for a canonical parameter name and its HF tensor names."""
    for rule in RULES:
        found = rule.pattern.match(canonical_name)
        if found:
            return rule, [name.format(*found.groups()) for name in rule.hf_names]
    raise UnmappedParameterError(
        f"parameter {canonical_name!r} has no Hugging Face counterpart (only Llama/Qwen2/Qwen3/"
        "Qwen3-MoE layers map)")


def _qkv_shard(read: Reader, names: list[str], config: HFModelConfig, tp_size: int,
               tp_rank: int) -> torch.Tensor:
    d = config.kv_channels
    groups = config.num_query_groups // tp_size
    q_per_group = config.num_attention_heads // config.num_query_groups
    first = tp_rank * groups
    q = read(names[0], ((first * q_per_group) * d, (first + groups) * q_per_group * d), None)
    k = read(names[1], (first * d, (first + groups) * d), None)
    v = read(names[2], (first * d, (first + groups) * d), None)
    rest = q.shape[1:]
    fused = torch.cat([q.reshape(groups, q_per_group * d, *rest),
                       k.reshape(groups, d, *rest), v.reshape(groups, d, *rest)], dim=1)
    return fused.reshape(groups * (q_per_group + 2) * d, *rest)


def local_shard(rule: Rule, names: list[str], read: Reader, shape: tuple[int, ...],
                config: HFModelConfig, tp_size: int, tp_rank: int,
                zero_centered: bool = False) -> torch.Tensor:
    """The tensor TP rank ``tp_rank`` holds for a parameter of local shape ``shape``;
    ``zero_centered``: the parameter is a norm weight stored as gamma - 1."""
    if rule.kind == "norm":
        weight = read(names[0], None, None)
        return weight - ZERO_CENTERED_OFFSET if zero_centered else weight
    if rule.kind == "replicated":
        return read(names[0], None, None)
    if rule.kind == "vocab":
        start = tp_rank * shape[0]
        stop = min(start + shape[0], config.vocab_size)
        out = torch.zeros(shape)
        if stop > start:  # padded rows (beyond the HF vocabulary) stay zero
            out[: stop - start] = read(names[0], (start, stop), None)
        return out
    if rule.kind == "row":
        return read(names[0], None, (tp_rank * shape[1], (tp_rank + 1) * shape[1]))
    if rule.kind == "gated":
        half = shape[0] // 2
        rows = (tp_rank * half, (tp_rank + 1) * half)
        return torch.cat([read(names[0], rows, None), read(names[1], rows, None)])
    if rule.kind == "qkv":
        return _qkv_shard(read, names, config, tp_size, tp_rank)
    raise AssertionError(f"unknown rule kind {rule.kind}")


def hf_tensors(rule: Rule, names: list[str], shards: list[torch.Tensor],
               config: HFModelConfig, zero_centered: bool = False) -> dict[str, torch.Tensor]:
    """HF tensors from the TP shards (in TP rank order) of one megatron parameter;
    ``zero_centered``: the parameter is a norm weight stored as gamma - 1."""
    if rule.kind == "norm":
        return {names[0]: shards[0] + ZERO_CENTERED_OFFSET if zero_centered else shards[0]}
    if rule.kind == "replicated":
        return {names[0]: shards[0]}
    if rule.kind == "vocab":
        return {names[0]: torch.cat(shards)[: config.vocab_size]}
    if rule.kind == "row":
        return {names[0]: torch.cat(shards, dim=1)}
    if rule.kind == "gated":
        halves = [shard.chunk(2) for shard in shards]
        return {names[0]: torch.cat([h[0] for h in halves]),
                names[1]: torch.cat([h[1] for h in halves])}
    if rule.kind == "qkv":
        full = torch.cat(shards)
        d = config.kv_channels
        q_per_group = config.num_attention_heads // config.num_query_groups
        grouped = full.reshape(config.num_query_groups, q_per_group + 2, d, *full.shape[1:])
        rest = full.shape[1:]
        return {names[0]: grouped[:, :q_per_group].reshape(-1, *rest),
                names[1]: grouped[:, q_per_group].reshape(-1, *rest),
                names[2]: grouped[:, q_per_group + 1].reshape(-1, *rest)}
    raise AssertionError(f"unknown rule kind {rule.kind}")
