"""Megatron-LM's multi-latent attention (MLA) flags (its ``mla`` argument group): DeepSeek-V2/V3
style attention, built from megatron-core's ``MLASelfAttention`` with this fork's THD core
attention (megatron.varlen.attention.mla).

Megatron-LM's ``core_transformer_config_from_args`` builds an ``MLATransformerConfig`` under
``--multi-latent-attention`` and copies these flags into its same-named fields; ``--rope-type``
unset lets the config keep its default, yarn. The YaRN correction flags (``--yarn-*``) feed
Megatron-LM's non-MLA ``--position-embedding-type yarn`` only (MLA's YaRN keeps the config's
``original_max_position_embeddings``, ``beta_fast`` and ``beta_slow``): that position embedding
is not built here, so they are refused.

Static and dynamic context parallelism run (megatron.varlen.attention.mla_attention moves MLA's
RoPE and the core attention to each micro-batch's CP group); with Transformer Engine's attention
only static CP (one line otherwise).
"""

from __future__ import annotations

import argparse

from megatron.varlen_training.refused_flags import (
    SWITCH, FlagRow, add_flag_rows, dest_of, refuse_given,
)
from megatron.varlen_training.varlen_arguments import attention_backend

MLA_FLAG = "--multi-latent-attention"
TE_BACKEND = "te"  # --attention-backend's Transformer Engine choice
ROPE, YARN = "rope", "yarn"
# MLATransformerConfig's rope_type when --rope-type is not given (Megatron-LM leaves it unset).
MLA_DEFAULT_ROPE_TYPE = YARN
# Megatron-LM's defaults of its mla group.
KV_LORA_RANK_DEFAULT = 32
QK_HEAD_DIM_DEFAULT = 128
QK_POS_EMB_HEAD_DIM_DEFAULT = 64
V_HEAD_DIM_DEFAULT = 128
MSCALE_DEFAULT = 1.0
MSCALE_ALL_DIM_DEFAULT = 0.0
ROTARY_SCALING_FACTOR_DEFAULT = 1.0

_YARN_WHY = ("Megatron-LM reads it only for --position-embedding-type yarn (YaRN on standard "
             "attention), not built here; multi-latent attention's YaRN keeps megatron-core's "
             "MLATransformerConfig defaults, as in Megatron-LM")
REFUSED_FLAGS = (
    FlagRow(("--cache-mla-latents",), SWITCH, False,
            "it caches MLA's latents for megatron-core's dynamic inference engine (FlashMLA "
            "decode); this fork trains"),
    FlagRow(("--mla-down-proj-fusion",), SWITCH, False,
            "it fuses the q/kv down-projections with the input norm in a Megatron-LM main layer "
            "that megatron-core 0.16.1 does not have; the unfused MLA here is the same math"),
    FlagRow(("--yarn-original-max-position-embeddings",), {"type": int}, None, _YARN_WHY),
    FlagRow(("--yarn-beta-fast",), {"type": float}, None, _YARN_WHY),
    FlagRow(("--yarn-beta-slow",), {"type": float}, None, _YARN_WHY),
)
YARN_ROUNDING_FLAGS = ("--yarn-correction-range-round-to-int",
                       "--no-yarn-correction-range-round-to-int")


def add_mla_args(parser: argparse.ArgumentParser) -> None:
    """Registers Megatron-LM's mla group (honoured and refused flags)."""
    group = parser.add_argument_group("multi-latent attention (Megatron-LM's mla group)")
    group.add_argument(MLA_FLAG, action="store_true",
                       help="DeepSeek-V2/V3 multi-latent attention (megatron-core's "
                            "MLASelfAttention with this fork's THD core attention), as "
                            "Megatron-LM; packing, static and dynamic context parallelism.")
    group.add_argument("--q-lora-rank", type=int, default=None,
                       help="Rank of the queries' low-rank projection (unset: queries are "
                            "projected from the hidden states directly), as Megatron-LM.")
    group.add_argument("--kv-lora-rank", type=int, default=KV_LORA_RANK_DEFAULT,
                       help="Rank of the keys' and values' low-rank (latent) projection.")
    group.add_argument("--qk-head-dim", type=int, default=QK_HEAD_DIM_DEFAULT,
                       help="Query/key channels per head without RoPE (a query/key head has "
                            "qk-head-dim + qk-pos-emb-head-dim channels).")
    group.add_argument("--qk-pos-emb-head-dim", type=int, default=QK_POS_EMB_HEAD_DIM_DEFAULT,
                       help="Query/key channels per head that RoPE rotates (the key's are "
                            "shared by all heads).")
    group.add_argument("--v-head-dim", type=int, default=V_HEAD_DIM_DEFAULT,
                       help="Value channels per head.")
    group.add_argument("--rotary-scaling-factor", type=float,
                       default=ROTARY_SCALING_FACTOR_DEFAULT,
                       help="YaRN's context extension factor (--rope-type yarn, MLA's default).")
    group.add_argument("--mscale", type=float, default=MSCALE_DEFAULT,
                       help="YaRN's attention scaling of the rotated channels (MLA).")
    group.add_argument("--mscale-all-dim", type=float, default=MSCALE_ALL_DIM_DEFAULT,
                       help="YaRN's mscale of the softmax scale (MLA: the scale is "
                            "mscale(factor, this)^2 / sqrt(q head dim)).")
    add_flag_rows(group, REFUSED_FLAGS)
    # Megatron-LM's pair sharing one dest, unset (None) unless either is given.
    for flag, action in zip(YARN_ROUNDING_FLAGS, ("store_true", "store_false")):
        group.add_argument(flag, action=action, default=None,
                           dest="yarn_correction_range_round_to_int",
                           help=f"Refused: {_YARN_WHY}.")


def validate_mla_args(args: argparse.Namespace, require) -> None:
    """Refuses what MLA cannot do here; resolves ``rope_type`` (yarn unless given) as
    Megatron-LM's config does (``require(cond, message)``)."""
    refuse_given(args, REFUSED_FLAGS, require)
    rounding = args.yarn_correction_range_round_to_int
    require(rounding is None, f"{YARN_ROUNDING_FLAGS[0 if rounding else 1]} is not supported: "
                              f"{_YARN_WHY}")
    require_mla_for_shape_flags(args, require)
    if not args.multi_latent_attention:
        return
    require(args.qk_pos_emb_head_dim % 2 == 0,
            f"--qk-pos-emb-head-dim {args.qk_pos_emb_head_dim} must be even: RoPE rotates "
            f"channel pairs")
    require(not args.group_query_attention,
            f"{MLA_FLAG} and --group-query-attention are mutually exclusive (as in "
            f"Megatron-LM): MLA shares one latent key/value projection across heads")
    # Dynamic CP moves MLA's RoPE and our core attention to each micro-batch's group; TE's
    # attention takes its group from the micro-batch's params, which MLA must not carry.
    require(not (args.dynamic_context_parallel and attention_backend(args) == TE_BACKEND),
            f"{MLA_FLAG} with --dynamic-context-parallel needs --attention-backend local or "
            f"flash (Transformer Engine's attention, {TE_BACKEND}, runs MLA on the static CP "
            f"group only)")
    if args.rope_type is None:
        args.rope_type = MLA_DEFAULT_ROPE_TYPE


def require_mla_for_shape_flags(args: argparse.Namespace, require) -> None:
    """An MLA shape flag off Megatron-LM's default without ``--multi-latent-attention`` would
    change nothing (Megatron-LM ignores it): refused, not silently dropped."""
    if args.multi_latent_attention:
        return
    for flag, default in SHAPE_FLAG_DEFAULTS.items():
        value = getattr(args, dest_of(flag, {}))
        require(value == default,
                f"{flag} {value} needs {MLA_FLAG} (it shapes multi-latent attention only)")


# The flags that shape MLA, with Megatron-LM's defaults (the values that change nothing).
SHAPE_FLAG_DEFAULTS = {
    "--q-lora-rank": None, "--kv-lora-rank": KV_LORA_RANK_DEFAULT,
    "--qk-head-dim": QK_HEAD_DIM_DEFAULT, "--qk-pos-emb-head-dim": QK_POS_EMB_HEAD_DIM_DEFAULT,
    "--v-head-dim": V_HEAD_DIM_DEFAULT, "--rotary-scaling-factor": ROTARY_SCALING_FACTOR_DEFAULT,
    "--mscale": MSCALE_DEFAULT, "--mscale-all-dim": MSCALE_ALL_DIM_DEFAULT,
}


def mla_attention_parameters(hidden_size: int, num_heads: int, q_lora_rank: int | None,
                             kv_lora_rank: int, qk_head_dim: int, qk_pos_emb_head_dim: int,
                             v_head_dim: int) -> int:
    """Weights of one MLA layer's projections (norms and biases aside), whole: queries
    (directly, or down to ``q_lora_rank`` and up), the shared key/value latent plus the rotated
    key channels, its up-projection to every head's key and value, and the output."""
    q_head = qk_head_dim + qk_pos_emb_head_dim
    queries = (hidden_size * num_heads * q_head if q_lora_rank is None
               else q_lora_rank * (hidden_size + num_heads * q_head))
    latent = hidden_size * (kv_lora_rank + qk_pos_emb_head_dim)
    up = kv_lora_rank * num_heads * (qk_head_dim + v_head_dim)
    return queries + latent + up + num_heads * v_head_dim * hidden_size
