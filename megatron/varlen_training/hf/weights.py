"""Which Hugging Face tensors make each megatron-core parameter, and how TP shards them.

A parameter is named by its layout-free (canonical) name
(``layout_invariant_init.canonical_parameter_name``: global layer numbers, a tied output layer named
as the word embedding). Each name matches one :class:`Rule`, whose ``kind`` says how the HF tensors
combine and split over TP ranks:

- ``replicated``: every rank holds the whole HF tensor (the MoE router).
- ``norm``: a norm's weight, replicated; a norm that stores gamma - 1 (``--apply-layernorm-1p``)
  holds the HF weight minus 1, so import subtracts 1 and export adds it back.
- ``vocab``: embedding / output layer, rows split over TP; megatron's padded rows (beyond the
  HF vocabulary) are zero on import and dropped on export.
- ``row``: a row-parallel linear layer (o_proj, down_proj), split by input columns.
- ``qkv``: megatron fuses q, k, v per query group, ``[q heads of group g..., k_g, v_g]`` for each
  group g, and TP ranks hold whole groups (megatron-core's ``get_query_key_value_tensors``).
- ``gated``: the SwiGLU fc1 holds ``[gate_r; up_r]`` on TP rank r (each half split over TP).
- ``column``: a column-parallel linear layer (DeepSeek-V3's MLA projections), split by output
  rows. Its ``rope`` rows are the rotated channels (``per_head``: the last
  ``qk_pos_emb_head_dim`` rows of each head's query; ``tail``: the last rows of
  ``kv_a_proj_with_mqa``, the shared rotated key after the latent). megatron-core's MLA reads
  them as interleaved pairs ``(x0, y0, x1, y1, ...)``; a checkpoint with ``rope_interleave``
  False stores them as halves ``(x0, x1, ..., y0, y1, ...)``, permuted here in both directions.

Layout notes for DeepSeek-V3 (MLA): megatron's ``linear_kv_down_proj`` is
``kv_a_proj_with_mqa`` as it is (``[latent; rotated key]``, split by megatron-core at
``kv_lora_rank``), ``linear_kv_up_proj`` is ``kv_b_proj`` (per head ``[key; value]``), the
latent norms ``q_layernorm`` / ``kv_layernorm`` are ``q_a_layernorm`` / ``kv_a_layernorm``, and
the router's ``expert_bias`` (a buffer, not a parameter) is ``e_score_correction_bias``.

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


PER_HEAD, TAIL = "per_head", "tail"  # where a ``column`` rule's rotated rows are


@dataclass(frozen=True)
class Rule:
    pattern: re.Pattern
    kind: str
    hf_names: tuple[str, ...]  # format strings taking the global layer (and expert) index
    rope: str | None = None  # column rules: where the rotated rows are (PER_HEAD, TAIL)


def _rule(pattern: str, kind: str, *hf_names: str, rope: str | None = None) -> Rule:
    return Rule(re.compile(pattern + "$"), kind, hf_names, rope)


_ATTN = _LAYER + r"self_attention\."
_HF_ATTN = _HF_LAYER + "self_attn."
# Standard attention (Llama/Qwen): fused QKV, Qwen3's per-head norms.
GQA_RULES = (
    _rule(_ATTN + r"linear_qkv\.weight", "qkv", *(_HF_ATTN + f"{p}_proj.weight" for p in "qkv")),
    _rule(_ATTN + r"linear_qkv\.bias", "qkv", *(_HF_ATTN + f"{p}_proj.bias" for p in "qkv")),
    _rule(_ATTN + r"q_layernorm\.weight", "norm", _HF_ATTN + "q_norm.weight"),
    _rule(_ATTN + r"k_layernorm\.weight", "norm", _HF_ATTN + "k_norm.weight"),
)
# DeepSeek-V3's multi-latent attention (module docstring: layout notes).
MLA_RULES = (
    _rule(_ATTN + r"linear_q_proj\.weight", "column", _HF_ATTN + "q_proj.weight",
          rope=PER_HEAD),
    _rule(_ATTN + r"linear_q_down_proj\.weight", "column", _HF_ATTN + "q_a_proj.weight"),
    _rule(_ATTN + r"linear_q_up_proj\.weight", "column", _HF_ATTN + "q_b_proj.weight",
          rope=PER_HEAD),
    _rule(_ATTN + r"linear_kv_down_proj\.weight", "column",
          _HF_ATTN + "kv_a_proj_with_mqa.weight", rope=TAIL),
    _rule(_ATTN + r"linear_kv_up_proj\.weight", "column", _HF_ATTN + "kv_b_proj.weight"),
    _rule(_ATTN + r"q_layernorm\.weight", "norm", _HF_ATTN + "q_a_layernorm.weight"),
    _rule(_ATTN + r"kv_layernorm\.weight", "norm", _HF_ATTN + "kv_a_layernorm.weight"),
    _rule(_LAYER + r"mlp\.router\.expert_bias", "replicated",
          _HF_LAYER + "mlp.gate.e_score_correction_bias"),
    _rule(_LAYER + r"mlp\.shared_experts\.linear_fc1\.weight", "gated",
          _HF_LAYER + "mlp.shared_experts.gate_proj.weight",
          _HF_LAYER + "mlp.shared_experts.up_proj.weight"),
    _rule(_LAYER + r"mlp\.shared_experts\.linear_fc2\.weight", "row",
          _HF_LAYER + "mlp.shared_experts.down_proj.weight"),
    # Transformer Engine specs fuse the latent norms into the up-projections (untested here).
    _rule(_ATTN + r"linear_q_up_proj\.layer_norm_weight", "norm",
          _HF_ATTN + "q_a_layernorm.weight"),
    _rule(_ATTN + r"linear_kv_up_proj\.layer_norm_weight", "norm",
          _HF_ATTN + "kv_a_layernorm.weight"),
)
# The router's buffers that a checkpoint holds (every other buffer is runtime state).
MAPPED_BUFFER_SUFFIXES = ("mlp.router.expert_bias",)

RULES = (
    _rule(r"embedding\.word_embeddings\.weight", "vocab", "model.embed_tokens.weight"),
    _rule(r"output_layer\.weight", "vocab", "lm_head.weight"),
    _rule(r"decoder\.final_layernorm\.weight", "norm", "model.norm.weight"),
    _rule(_LAYER + r"input_layernorm\.weight", "norm",
          _HF_LAYER + "input_layernorm.weight"),
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


def match(canonical_name: str, mla: bool = False) -> tuple[Rule, list[str]]:
    """The rule for a canonical parameter (or mapped buffer) name and its HF tensor names;
    ``mla``: the model has DeepSeek-V3's attention (its norms have other HF names)."""
    for rule in (MLA_RULES if mla else GQA_RULES) + RULES:
        found = rule.pattern.match(canonical_name)
        if found:
            return rule, [name.format(*found.groups()) for name in rule.hf_names]
    raise UnmappedParameterError(
        f"parameter {canonical_name!r} has no Hugging Face counterpart (only Llama/Qwen2/Qwen3/"
        "Qwen3-MoE/DeepSeek-V3 layers map)")


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


def _interleaved_source(rope_dim: int) -> torch.Tensor:
    """For each rotated channel in megatron-core's interleaved order ``(x0, y0, x1, y1, ...)``,
    its row in the halves order ``(x0, x1, ..., y0, y1, ...)``."""
    channel = torch.arange(rope_dim)
    return (channel % 2) * (rope_dim // 2) + channel // 2


def rope_source_rows(rule: Rule, config: HFModelConfig, num_rows: int) -> torch.Tensor | None:
    """Row i of the megatron parameter is row ``source[i]`` of the HF tensor (None: the
    identity, a checkpoint with interleaved rotated channels or no rotated rows)."""
    mla = config.mla
    if rule.rope is None or mla is None or mla.rope_interleave:
        return None
    rope = mla.qk_pos_emb_head_dim
    source = torch.arange(num_rows)
    if rule.rope == PER_HEAD:  # each head: qk_head_dim plain rows, then the rotated ones
        heads = source.view(-1, mla.qk_head_dim + rope)
        heads[:, mla.qk_head_dim:] = heads[:, mla.qk_head_dim:][:, _interleaved_source(rope)]
    else:  # TAIL: the latent, then the shared rotated key
        source[-rope:] = source[-rope:][_interleaved_source(rope)]
    return source


def _column_shard(rule: Rule, name: str, read: Reader, shape: tuple[int, ...],
                  config: HFModelConfig, tp_size: int, tp_rank: int) -> torch.Tensor:
    """TP rank ``tp_rank``'s rows of a column-parallel weight, reading only the rows it needs
    (with a rope permutation, the span of their source rows: within its heads, or up to the
    rotated tail)."""
    start, stop = tp_rank * shape[0], (tp_rank + 1) * shape[0]
    source = rope_source_rows(rule, config, shape[0] * tp_size)
    if source is None:
        return read(name, (start, stop), None)
    rows = source[start:stop]
    low, high = int(rows.min()), int(rows.max()) + 1
    return read(name, (low, high), None)[rows - low]


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
    if rule.kind == "column":
        return _column_shard(rule, names[0], read, shape, config, tp_size, tp_rank)
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
    if rule.kind == "column":
        full = torch.cat(shards)
        source = rope_source_rows(rule, config, full.shape[0])
        if source is None:
            return {names[0]: full}
        hf = torch.empty_like(full)
        hf[source] = full  # the inverse of the import's full[i] = hf[source[i]]
        return {names[0]: hf}
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
