"""Every numeric flag's valid range, and the checks between numeric flags: the one place.

:data:`FLAG_RANGES` names a :class:`FlagRange` for every ``type=int``/``type=float`` flag of
pretrain_gpt.py and pretrain_mamba.py (tests/unit_tests/reliability/test_flag_ranges.py fails for
a numeric flag missing here). :func:`validate_ranges` runs first in argument validation, so
later checks may divide by sizes and compare numbers without meeting 0, NaN or infinity.
:func:`validate_relations` checks what one flag alone cannot say (``--min-lr <= --lr``, heads
dividing the hidden size, ...). :func:`validate_memory` refuses sizes whose weights or batches
can never fit the machine (a 10^9-token vocabulary), :func:`validate_metrics_path` the
``--log-metrics-jsonl`` path and :func:`validate_metric_writers` the TensorBoard/wandb flags. All
run on every rank, so every rank fails alike, in one line.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from dataclasses import dataclass

from megatron.varlen_training.mla_arguments import mla_attention_parameters
from megatron.varlen_training.model_file_tokenizers import TIKTOKEN_SPECIAL_TOKENS
from megatron.varlen_training.pipeline_arguments import MICROBATCH_GROUP, pipeline_split_of

# Token counts of one sequence live in int32 cu_seqlens (megatron-core's and FlashAttention's
# THD format), so no sequence, position table or per-rank budget can be longer than this.
MAX_TOKENS = 2**31 - 1
# np.random.seed (initialize.set_random_seeds) takes 0 <= seed < 2**32.
MAX_SEED = 2**32 - 1
# A collective that waits a year for a peer is a hang; the bound also keeps the timeout inside
# what datetime.timedelta (torch.distributed's timeout type) can hold.
MAX_TIMEOUT_MINUTES = 365 * 24 * 60
# The smallest useful vocabulary: one content id plus the end-of-document id.
MIN_VOCAB_SIZE = 2
GIB = 2**30
MAX_NUM_WORKERS = 256  # --num-workers: reader processes per rank


@dataclass(frozen=True)
class FlagRange:
    """The values a numeric flag may take: ``low``/``high`` (None: unbounded), each inclusive
    unless ``*_open``; floats must also be finite. ``why`` ends the error message."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    why: str = ""

    def contains(self, value) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def describe(self) -> str:
        """``>= 1``, ``> 0``, ``in [0, 1)``, ``<= 5``."""
        if self.low is not None and self.high is not None:
            return (f"in {'(' if self.low_open else '['}{_number(self.low)}, "
                    f"{_number(self.high)}{')' if self.high_open else ']'}")
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {_number(self.low)}"
        return f"{'<' if self.high_open else '<='} {_number(self.high)}"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


# Sizes, counts and intervals: 0 or less would divide by zero later or silently do nothing.
COUNT = FlagRange(1)
# Token lengths: also bounded by the int32 sequence boundaries.
TOKENS = FlagRange(1, MAX_TOKENS, why="sequence boundaries are int32")
NON_NEGATIVE_COUNT = FlagRange(0)
# Dropout probabilities: p = 1 zeroes every activation it touches (torch returns zeros), which
# trains nothing; Megatron-LM's dropout flags are probabilities of dropping, in [0, 1).
PROBABILITY = FlagRange(0.0, 1.0, high_open=True, why="a dropout probability; 1 drops everything")
# Adam's betas are moment decay rates: torch.optim.Adam requires 0 <= beta < 1.
ADAM_BETA = FlagRange(0.0, 1.0, high_open=True, why="an Adam moment decay rate")
NON_NEGATIVE_FLOAT = FlagRange(0.0)
POSITIVE_FLOAT = FlagRange(0.0, low_open=True)
FRACTION = FlagRange(0.0, 1.0, why="a fraction of the layers")

# Every numeric flag (argparse dest) of both entry points, with its range.
FLAG_RANGES: dict[str, FlagRange] = {
    # network size
    "num_layers": COUNT,
    "hidden_size": COUNT,
    "ffn_hidden_size": COUNT,
    "num_attention_heads": COUNT,
    "num_query_groups": COUNT,
    "seq_length": TOKENS,
    "max_position_embeddings": TOKENS,
    # base**(-2i/d) must fall with i for positions to be told apart; base 1 gives every
    # dimension the same frequency, base 0 infinite ones.
    "rotary_base": FlagRange(2, why="RoPE frequencies base**(-2i/d) must decrease"),
    "mtp_num_layers": FlagRange(1, why="leave the flag out for no multi-token prediction"),
    "make_vocab_size_divisible_by": COUNT,
    "padded_vocab_size": COUNT,  # Megatron-LM's --padded-vocab-size (megatron_lm_census_flags.py)
    "init_method_std": FlagRange(0.0, low_open=True, why="std 0 starts every weight at 0"),
    "hidden_dropout": PROBABILITY,
    "attention_dropout": PROBABILITY,
    # training
    "micro_batch_size": COUNT,
    "global_batch_size": COUNT,
    "train_iters": COUNT,
    "seed": FlagRange(0, MAX_SEED, why="numpy's seed range"),
    "clip_grad": FlagRange(0.0, why="0 disables clipping"),
    "weight_decay": NON_NEGATIVE_FLOAT,
    "adam_beta1": ADAM_BETA,
    "adam_beta2": ADAM_BETA,
    # Adam divides by sqrt(v) + eps: eps 0 divides 0 by 0 for a parameter whose gradient is 0.
    "adam_eps": FlagRange(0.0, low_open=True, why="Adam divides by sqrt(v) + eps"),
    # learning rate
    "lr": NON_NEGATIVE_FLOAT,
    "min_lr": NON_NEGATIVE_FLOAT,
    "decoupled_lr": NON_NEGATIVE_FLOAT,
    "decoupled_min_lr": NON_NEGATIVE_FLOAT,
    "lr_decay_iters": COUNT,
    "lr_warmup_iters": NON_NEGATIVE_COUNT,
    # sample-based schedule (schedule_arguments.py)
    "train_samples": COUNT,
    # --rampup-batch-size START INCREMENT SAMPLES: megatron-core divides by INCREMENT and by
    # SAMPLES / the number of increments, and a batch of 0 samples trains nothing.
    "rampup_batch_size": COUNT,
    "lr_decay_samples": COUNT,
    "lr_warmup_samples": NON_NEGATIVE_COUNT,
    # megatron-core's scheduler requires the warm-up to end before the decay does.
    "lr_warmup_fraction": FlagRange(0.0, 1.0, high_open=True,
                                    why="a share of the decay length; warm-up ends before it"),
    # warm-up start, WSD anneal, weight-decay ramp (schedule_arguments.py)
    "lr_warmup_init": NON_NEGATIVE_FLOAT,
    "lr_wsd_decay_iters": COUNT,
    "lr_wsd_decay_samples": COUNT,
    "start_weight_decay": NON_NEGATIVE_FLOAT,
    "end_weight_decay": NON_NEGATIVE_FLOAT,
    # fp16 loss scaling (loss_scale_arguments.py)
    "loss_scale": POSITIVE_FLOAT,
    "initial_loss_scale": POSITIVE_FLOAT,
    "min_loss_scale": POSITIVE_FLOAT,
    "loss_scale_window": FlagRange(1.0),
    "hysteresis": COUNT,
    # distributed
    "tensor_model_parallel_size": COUNT,
    "pipeline_model_parallel_size": COUNT,
    "num_layers_per_virtual_pipeline_stage": COUNT,
    # uneven pipeline stages (pipeline_arguments.py checks how they split --num-layers)
    "decoder_first_pipeline_num_layers": FlagRange(1, why="a stage holds at least one layer"),
    "decoder_last_pipeline_num_layers": FlagRange(1, why="a stage holds at least one layer"),
    "num_virtual_stages_per_pipeline_rank": COUNT,
    # the interleaved schedule's micro-batch group (pipeline_arguments.py: >= PP under VPP)
    "microbatch_group_size_per_vp_stage": COUNT,
    "context_parallel_size": COUNT,
    # data, logging, checkpointing
    "vocab_size": FlagRange(MIN_VOCAB_SIZE, why="one content id plus end-of-document"),
    "tiktoken_num_special_tokens": FlagRange(
        len(TIKTOKEN_SPECIAL_TOKENS), why="TikTokenizer's ids start with its special tokens "
                                          f"{' '.join(TIKTOKEN_SPECIAL_TOKENS)}"),
    "log_interval": COUNT,
    "tensorboard_log_interval": COUNT,
    # logging_arguments.py: events a TensorBoard writer queues (0 would flush on every add);
    # the memory line's interval; a refused flag's iteration count
    "tensorboard_queue_size": COUNT,
    "log_memory_interval": COUNT,
    "moe_routing_trace_max_training_iters": FlagRange(1, why="a refused flag's count"),
    "timing_log_level": FlagRange(0, 2, why="Megatron-LM's timing levels 0, 1, 2"),
    "eval_interval": COUNT,
    "eval_iters": NON_NEGATIVE_COUNT,
    "save_interval": COUNT,
    "ckpt_step": NON_NEGATIVE_COUNT,  # an iteration (checkpoint_arguments.py)
    "non_persistent_save_interval": COUNT,  # refused whatever its value; a count if given
    # indexed data's reader processes per rank (data_arguments.py); 0: none. Each is a forked
    # copy of the rank: far more than a node has cores only multiplies memory.
    "num_workers": FlagRange(0, MAX_NUM_WORKERS, why="DataLoader processes per rank"),
    # packing and dynamic CP (varlen_arguments.py)
    "min_dynamic_context_parallel_size": COUNT,
    "max_seqlen_per_dp_cp_rank": TOKENS,
    "document_piece_length": TOKENS,  # --packing-unit document (document_arguments.py)
    "thd_max_packed_sequences": COUNT,
    # Hugging Face model features (hf/arguments.py)
    "kv_channels": COUNT,
    # A norm divides by sqrt(variance + eps): 0 divides by zero on a constant vector.
    "norm_epsilon": FlagRange(0.0, low_open=True, why="norms divide by sqrt(var + eps)"),
    # Llama-3 RoPE scaling stretches the context by this factor (transformers requires >= 1).
    "rope_scaling_factor": FlagRange(1.0, why="a context stretch factor"),
    # Megatron-LM's model flags (model_arguments.py): RoPE rotates a share of each head's
    # channels (0 rotates none) and divides positions by the interpolation factor.
    "rotary_percent": FlagRange(0.0, 1.0, low_open=True, why="a share of the head's channels"),
    "rotary_seq_len_interpolation_factor": FlagRange(1, why="positions are divided by it"),
    "mtp_loss_scaling_factor": FlagRange(0.0, why="a weight of the MTP loss"),
    "glu_linear_offset": FlagRange(0.0, why="an offset added to the GLU's linear half"),
    "activation_func_clamp_value": FlagRange(0.0, low_open=True, why="a clamp bound"),
    "embedding_init_method_std": FlagRange(0.0, low_open=True,
                                           why="std 0 starts every weight at 0"),
    "moe_input_jitter_eps": FlagRange(0.0, why="a refused flag's noise scale"),
    "moe_latent_size": FlagRange(1, why="a refused flag's size"),
    # multi-latent attention (mla_arguments.py): widths and ranks; YaRN's stretch factor (below
    # 1 it changes nothing) and its attention scales; the refused non-MLA YaRN corrections.
    "q_lora_rank": COUNT,
    "kv_lora_rank": COUNT,
    "qk_head_dim": COUNT,
    "qk_pos_emb_head_dim": COUNT,
    "v_head_dim": COUNT,
    "rotary_scaling_factor": FlagRange(1.0, why="a context stretch factor"),
    "mscale": FlagRange(0.0, why="a scale of YaRN's attention"),
    "mscale_all_dim": FlagRange(0.0, why="a scale of YaRN's attention"),
    "yarn_original_max_position_embeddings": FlagRange(1, why="a refused flag's length"),
    "yarn_beta_fast": FlagRange(0.0, why="a refused flag's YaRN bound"),
    "yarn_beta_slow": FlagRange(0.0, why="a refused flag's YaRN bound"),
    # Megatron-LM's FP8 settings and removed flags (kernel_arguments.py): refused but at the
    # neutral value; a value out of range is wrong whatever happens to the flag.
    "fp8_margin": FlagRange(0, why="a refused flag's FP8 scaling margin"),
    "fp8_interval": FlagRange(1, why="a refused flag's FP8 scaling interval"),
    "fp8_amax_history_len": FlagRange(1, why="a refused flag's FP8 amax history length"),
    "batch_size": FlagRange(1, why="a removed flag's batch size"),
    "warmup": FlagRange(0, why="a removed flag's warm-up iterations"),
    "model_parallel_size": FlagRange(1, why="a removed flag's parallel size"),
    # reliability (reliability_arguments.py)
    "distributed_timeout_minutes": FlagRange(0.0, MAX_TIMEOUT_MINUTES, low_open=True,
                                             why="a longer wait is a hang"),
    # exit conditions (reliability_arguments.py): an interval never reached or a duration
    # never spent just trains to --train-iters.
    "exit_interval": COUNT,
    "exit_duration_in_mins": POSITIVE_FLOAT,
    # activation recomputation (recompute_arguments.py; the chunk's layer count is checked there)
    "recompute_num_layers": COUNT,
    # mixture of experts (moe_arguments.py)
    "num_experts": COUNT,
    "moe_router_topk": COUNT,
    "moe_ffn_hidden_size": COUNT,
    "moe_shared_expert_intermediate_size": COUNT,
    "expert_model_parallel_size": COUNT,
    "expert_tensor_parallel_size": COUNT,
    "moe_aux_loss_coeff": NON_NEGATIVE_FLOAT,
    "moe_z_loss_coeff": NON_NEGATIVE_FLOAT,
    "moe_router_topk_scaling_factor": POSITIVE_FLOAT,
    # Capacity (tokens per expert) = factor x tokens x top-k / experts: 0 drops every token.
    "moe_expert_capacity_factor": FlagRange(0.0, low_open=True, why="0 drops every token"),
    "moe_router_bias_update_rate": NON_NEGATIVE_FLOAT,
    "moe_router_num_groups": COUNT,
    "moe_router_group_topk": COUNT,
    # runtime (runtime_arguments.py): 0 is "never" for the GC interval; a profiled window
    # needs start < end (checked there, with --profile); a rank is a global rank
    "manual_gc_interval": NON_NEGATIVE_COUNT,
    "empty_unused_memory_level": FlagRange(0, 2, why="Megatron-LM's levels 0, 1, 2"),
    "profile_step_start": NON_NEGATIVE_COUNT,
    "profile_step_end": COUNT,
    "profile_ranks": FlagRange(0, why="a global rank"),
    "logging_level": FlagRange(0, why="a Python logging level (10 DEBUG ... 50 CRITICAL)"),
    # refused runtime families (runtime_arguments.py): in range, only the neutral value passes
    "straggler_ctrlr_port": FlagRange(0, 65535, why="a TCP port"),
    "straggler_minmax_count": COUNT,
    "ft_num_warmup_iters": NON_NEGATIVE_COUNT,
    "error_injection_rate": NON_NEGATIVE_COUNT,
    "check_weight_hash_across_dp_replicas_interval": COUNT,
    "inprocess_max_iterations": COUNT,
    "inprocess_active_world_size": COUNT,
    **dict.fromkeys(("inprocess_monitor_thread_interval", "inprocess_monitor_process_interval",
                     "inprocess_progress_watchdog_interval", "inprocess_heartbeat_interval",
                     "inprocess_soft_timeout", "inprocess_hard_timeout",
                     "inprocess_heartbeat_timeout", "inprocess_barrier_timeout",
                     "inprocess_completion_timeout", "inprocess_last_call_wait",
                     "inprocess_termination_grace_time"), POSITIVE_FLOAT),
    # hybrid Mamba models (hybrid_arguments.py, pretrain_mamba.py only)
    "hybrid_attention_ratio": FRACTION,
    "hybrid_mlp_ratio": FRACTION,
    "mamba_state_dim": COUNT,
    "mamba_head_dim": COUNT,
    "mamba_num_groups": COUNT,
    "mamba_num_heads": COUNT,
    # optimizer choice (optimizer_arguments.py); torch's SGD refuses a negative momentum. The
    # Muon/Lion/offload tuning values are read only by refused optimizers: kept finite.
    "sgd_momentum": NON_NEGATIVE_FLOAT,
    "muon_momentum": NON_NEGATIVE_FLOAT,
    "muon_num_ns_steps": COUNT,
    "muon_extra_scale_factor": NON_NEGATIVE_FLOAT,
    "lion_beta1": ADAM_BETA,
    "lion_beta2": ADAM_BETA,
    "optimizer_offload_fraction": FlagRange(0.0, 1.0, why="a share of the optimizer state"),
    # DDP buckets (ddp_arguments.py); refused flags' values still typed sensibly.
    "ddp_bucket_size": COUNT,
    "ddp_num_buckets": COUNT,
    "num_distributed_optimizer_instances": COUNT,
    "suggested_communication_unit_size": COUNT,
    "megatron_fsdp_version": FlagRange(1, 2, why="Megatron FSDP's versions 1 and 2"),
    "num_virtual_stages_per_pipeline_rank": COUNT,
    "distributed_timeout_seconds_after_init": COUNT,  # refused whatever its value
    "local_rank": NON_NEGATIVE_COUNT,  # must also equal $LOCAL_RANK (ddp_arguments.py)
    # checkpoint flags refused whatever their value (checkpoint_save_arguments.py)
    "replication_jump": COUNT,
    "replication_factor": COUNT,
    "save_retain_interval": COUNT,
    "save_wgrads_interval": COUNT,
    "save_dgrads_interval": COUNT,
    "dist_ckpt_workers": COUNT,
    "override_ckpt_iteration": NON_NEGATIVE_COUNT,
    # training-loop flags refused whatever their value (training_loop_arguments.py)
    "train_sync_interval": COUNT,
    "check_weight_hash_across_dp_replicas_interval": COUNT,
    # dataset builder (dataloader_arguments.py)
    "num_dataset_builder_threads": COUNT,
    # A share of extra samples per blended dataset (megatron-core's default 0.005): beyond
    # doubling, the sample counts it multiplies only grow without use.
    "mid_level_dataset_surplus": FlagRange(0.0, 1.0, why="a share of extra samples"),
    "fim_rate": FRACTION,
    "fim_spm_rate": FRACTION,
    "fim_fragment_rate": FRACTION,
    # evaluation flags (validation_arguments.py): --eval-micro-batch-size is accepted only at
    # the training one, --decoder-seq-length refused whatever its value; a count if given
    "eval_micro_batch_size": COUNT,
    "eval_global_batch_size": COUNT,
    "start_eval_at_iter": NON_NEGATIVE_COUNT,
    "decoder_seq_length": COUNT,
}


# Numeric flags whose dest is not their name (Megatron-LM's: a megatron-core config field's).
_FLAGS_OF_RENAMED_DESTS = {"microbatch_group_size_per_vp_stage": MICROBATCH_GROUP}


def flag_name(dest: str) -> str:
    """``--dest-with-dashes``: the flag of an argparse dest (every numeric flag is spelt so, but
    for the few renamed ones)."""
    return _FLAGS_OF_RENAMED_DESTS.get(dest, "--" + dest.replace("_", "-"))


def range_problem(dest: str, value) -> str | None:
    """The one-line complaint about ``value`` for flag ``dest``, or None if it is in range."""
    if isinstance(value, (list, tuple)):  # a flag of several values (--profile-ranks): each
        return next(filter(None, (range_problem(dest, each) for each in value)), None)
    allowed = FLAG_RANGES[dest]
    if value is None or allowed.contains(value):
        return None
    finite = "a finite number " if isinstance(value, float) else ""
    why = f" ({allowed.why})" if allowed.why else ""
    return f"{flag_name(dest)} must be {finite}{allowed.describe()} (got {value}){why}"


def range_problems(values: dict) -> list[str]:
    """The complaints about every numeric flag in ``values`` (dest -> value) out of its range;
    other entries, and optional flags left at None, are not checked."""
    problems = (range_problem(dest, value) for dest, value in values.items()
                if dest in FLAG_RANGES)
    return [problem for problem in problems if problem is not None]


def validate_ranges(args, require) -> None:
    """Every numeric flag ``args`` has (pretrain_mamba.py's are a superset) is in its range;
    optional flags left at None are not checked."""
    for problem in range_problems({dest: getattr(args, dest) for dest in FLAG_RANGES
                                   if hasattr(args, dest)}):
        require(False, problem)


def learning_rate_problem(lr: float, min_lr: float) -> str | None:
    """Why ``--min-lr``/``--lr`` do not make a decaying schedule, or None."""
    if min_lr <= lr:
        return None
    return (f"--min-lr {min_lr} exceeds --lr {lr} (the schedule decays from --lr down to "
            f"--min-lr; lower --min-lr or raise --lr)")


def decoupled_learning_rate_problem(decoupled_lr: float | None, decoupled_min_lr: float | None,
                                    min_lr: float) -> str | None:
    """Why --decoupled-lr/--decoupled-min-lr do not make a decaying schedule for the embedding
    and output layer, or None. megatron-core ignores --decoupled-min-lr without --decoupled-lr
    (a silent no-op: refused)."""
    if decoupled_lr is None:
        if decoupled_min_lr is None:
            return None
        return (f"--decoupled-min-lr {decoupled_min_lr} needs --decoupled-lr (it is the final LR "
                f"of the decoupled schedule; without it the embedding follows --lr and --min-lr)")
    if decoupled_min_lr is None:
        if min_lr <= decoupled_lr:
            return None
        return (f"--min-lr {min_lr} exceeds --decoupled-lr {decoupled_lr} (without "
                f"--decoupled-min-lr the embedding's LR decays to --min-lr; set "
                f"--decoupled-min-lr or raise --decoupled-lr)")
    if decoupled_min_lr <= decoupled_lr:
        return None
    return (f"--decoupled-min-lr {decoupled_min_lr} exceeds --decoupled-lr {decoupled_lr} (the "
            f"embedding's schedule decays from --decoupled-lr down to --decoupled-min-lr; lower "
            f"--decoupled-min-lr or raise --decoupled-lr)")


def head_split_problem(hidden_size: int, num_attention_heads: int,
                       kv_channels: int | None) -> str | None:
    """As Megatron-LM: without --kv-channels each head gets hidden / heads channels."""
    if kv_channels is not None or hidden_size % num_attention_heads == 0:
        return None
    return (f"--hidden-size {hidden_size} is not divisible by --num-attention-heads "
            f"{num_attention_heads} (each head gets hidden size / heads channels; change one of "
            f"them or set --kv-channels)")


def layer_pattern_problem(flag: str, pattern, num_layers: int) -> str | None:
    """A per-layer 0/1 pattern (--moe-layer-freq, --window-attn-skip-freq, --no-rope-freq; a
    list, or a run config's tuple) needs one entry per layer; an int or None has no length."""
    if isinstance(pattern, (list, tuple)) and len(pattern) != num_layers:
        return f"{flag} has {len(pattern)} entries for --num-layers {num_layers}"
    return None


def query_group_problem(num_attention_heads: int, num_query_groups: int | None,
                        group_query_attention: bool) -> str | None:
    """Why the key/value groups cannot serve the query heads, or None (None groups: unset)."""
    if num_query_groups is None:
        return None
    if not group_query_attention and num_query_groups != num_attention_heads:
        return (f"--num-query-groups {num_query_groups} has no effect without "
                f"--group-query-attention (add --group-query-attention or drop "
                f"--num-query-groups)")
    if num_attention_heads % num_query_groups:
        return (f"--num-attention-heads {num_attention_heads} is not divisible by "
                f"--num-query-groups {num_query_groups} (every key/value group serves the same "
                f"number of query heads)")
    return None


def validate_relations(args, require) -> None:
    """Numeric flags that constrain one another (after :func:`validate_ranges`)."""
    for problem in (learning_rate_problem(args.lr, args.min_lr),
                    decoupled_learning_rate_problem(args.decoupled_lr, args.decoupled_min_lr,
                                                    args.min_lr),
                    head_split_problem(args.hidden_size, args.num_attention_heads,
                                       args.kv_channels),
                    query_group_problem(args.num_attention_heads, args.num_query_groups,
                                        args.group_query_attention)):
        require(problem is None, problem)


# --- memory -----------------------------------------------------------------------------------
# Bytes one token takes in a batch on the host: tokens, labels and position ids (int64) and the
# float32 loss mask. Every step materialises its replica's samples this way before packing.
BATCH_BYTES_PER_TOKEN = 3 * 8 + 4


def host_memory_bytes() -> int:
    """This machine's physical memory (the limit :func:`validate_memory` checks against)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@dataclass(frozen=True)
class MemoryPart:
    """A lower bound of bytes one rank must hold, with the flags that size it."""

    what: str
    nbytes: int
    sized_by: str  # the flags and values that size it
    advice: str    # what to change


def attention_parameters(hidden: int, heads: int, query_groups: int, kv_channels: int) -> int:
    """Weights of one attention block: Q and output projections, K and V per group."""
    return hidden * kv_channels * (2 * heads + 2 * query_groups)


def gated_mlp(args) -> bool:
    """Whether the MLP is gated (fc1 twice as wide): --swiglu or --quick-geglu."""
    return bool(args.swiglu or args.quick_geglu)


def mlp_parameters(hidden: int, ffn_hidden: int, gated: bool) -> int:
    """Weights of one MLP: up (twice when gated) and down projections."""
    return hidden * ffn_hidden * (3 if gated else 2)


def gpt_layer_parameters(args) -> int:
    """Weights of one GPT transformer layer (attention + MLP), whole (before TP splits it)."""
    kv_channels = args.kv_channels or args.hidden_size // args.num_attention_heads
    attention = attention_parameters(args.hidden_size, args.num_attention_heads,
                                     args.num_query_groups, kv_channels)
    if getattr(args, "multi_latent_attention", False):
        attention = mla_attention_parameters(
            args.hidden_size, args.num_attention_heads, args.q_lora_rank, args.kv_lora_rank,
            args.qk_head_dim, args.qk_pos_emb_head_dim, args.v_head_dim)
    return attention + mlp_parameters(args.hidden_size, args.ffn_hidden_size, gated_mlp(args))


def _stage_layers_part(args, nbytes: int) -> MemoryPart:
    return MemoryPart("the layers of one pipeline stage", nbytes,
                      f"--num-layers {args.num_layers} x --hidden-size {args.hidden_size}",
                      "lower --num-layers or the layer widths, or split them with "
                      "--tensor-model-parallel-size/--pipeline-model-parallel-size")


def stage_memory_parts(args, layer_parameters: int) -> list[list[MemoryPart]]:
    """Lower bounds of the weights on a rank of the first and of the last pipeline stage (one
    list when there is one stage). ``layer_parameters``: the whole stack's, before TP/PP split
    it. Only weights, in their own dtype: gradients and optimizer state need more, so a model
    refused here can never train on this machine."""
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    hidden, size = args.hidden_size, (2 if (args.bf16 or args.fp16) else 4)  # weight bytes
    # each end stage's share of the stack: its layers (uneven stages: pipeline_arguments.py)
    stages = pipeline_split_of(args).stage_layers()
    first, last = ([_stage_layers_part(args, layer_parameters * layers // args.num_layers
                                       // tp * size)] for layers in (stages[0], stages[-1]))
    if args.padded_vocab_size is not None:
        embedding = MemoryPart(
            "the word embedding", args.padded_vocab_size // tp * hidden * size,
            f"--vocab-size {args.vocab_size} (padded to {args.padded_vocab_size}) x "
            f"--hidden-size {hidden}", "lower --vocab-size or --make-vocab-size-divisible-by, "
            "or shard it with --tensor-model-parallel-size")
        first.append(embedding)
        if pp > 1 or args.untie_embeddings_and_output_weights:  # the output layer's copy
            last.append(embedding)
    if args.position_embedding_type == "learned_absolute":
        first.append(MemoryPart(
            "the learned position table", args.max_position_embeddings * hidden * size,
            f"--max-position-embeddings {args.max_position_embeddings} x --hidden-size {hidden}",
            "lower --max-position-embeddings, or use --position-embedding-type rope"))
    if args.mtp_num_layers:
        last.append(MemoryPart(
            "the multi-token prediction layers",
            args.mtp_num_layers * gpt_layer_parameters(args) // tp * size,
            f"--mtp-num-layers {args.mtp_num_layers}", "lower --mtp-num-layers"))
    return [first + last[1:]] if pp == 1 else [first, last]


def batch_memory_part(args) -> MemoryPart:
    """A step's samples on one data-parallel replica: the global batch's share, each sample at
    least one token (exactly --seq-length when every sample is that long: unpacked runs pad to
    it, and plain mock data is made of it)."""
    flag, batch = _largest_batch(args)
    per_replica = batch // args.data_parallel_size
    every_sample_full = not args.sequence_packing or (args.mock_data and not args.sft)
    tokens = args.seq_length if every_sample_full else 1
    sized_by = f"{flag} {batch}" + (
        f" x --seq-length {args.seq_length}" if every_sample_full else "")
    return MemoryPart("one step's samples", per_replica * tokens * BATCH_BYTES_PER_TOKEN,
                      sized_by, f"lower {flag}, or add data-parallel ranks")


def _largest_batch(args) -> tuple[str, int]:
    """(flag, samples) of the largest batch a step holds: the training one, or an evaluation's
    (--eval-global-batch-size, when the run evaluates)."""
    evaluated = getattr(args, "eval_global_batch_size", None) if args.eval_iters > 0 else None
    if evaluated is not None and evaluated > args.global_batch_size:
        return "--eval-global-batch-size", evaluated
    return "--global-batch-size", args.global_batch_size


def validate_memory(args, require, layer_parameters: int) -> None:
    """Refuses sizes whose weights (see :func:`stage_memory_parts`) or batches cannot fit this
    machine's memory, the named limit: the model is built and initialised on the host
    (use_cpu_initialization) and batches are assembled there, so what exceeds physical host
    memory fails whatever the device. Not a memory planner: the device's own limit is left to
    torch's out-of-memory error at model build."""
    limit = host_memory_bytes()
    for parts in stage_memory_parts(args, layer_parameters):
        parts = parts + [batch_memory_part(args)]
        need = sum(part.nbytes for part in parts)
        largest = max(parts, key=lambda part: part.nbytes)
        require(need <= limit,
                f"{largest.sized_by}: {largest.what} take(s) at least "
                f"{largest.nbytes / GIB:.1f} GiB on one rank ({need / GIB:.1f} GiB with the "
                f"rest), above this machine's {limit / GIB:.1f} GiB of memory ({largest.advice})")


# --- paths ------------------------------------------------------------------------------------


def metrics_path_problem(path: str) -> str | None:
    """Why ``path`` cannot take the per-iteration JSONL (appended; missing parent folders are
    created, as the writer does), or None. Checks without creating anything."""
    if os.path.isdir(path):
        return "is a directory; name a file in it"
    if os.path.exists(path):
        return None if os.access(path, os.W_OK) else "is not writable"
    ancestor = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        return f"cannot be created: {ancestor!r} is a file, not a directory"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"cannot be created: directory {ancestor!r} is not writable"
    return None


def validate_metrics_path(args, require) -> None:
    """``--log-metrics-jsonl`` names a writable file; checked on every rank at start-up (only
    the last rank writes it, hours later if it failed only then)."""
    if args.log_metrics_jsonl is None:
        return
    problem = metrics_path_problem(args.log_metrics_jsonl)
    require(problem is None, f"--log-metrics-jsonl {args.log_metrics_jsonl!r} {problem}")


# The metric writers' optional packages (metric_writers.py imports them when it builds one).
WRITER_PACKAGES = {"--tensorboard-dir": "tensorboard", "--wandb-project": "wandb"}


def is_importable(package: str) -> bool:
    """Whether ``package`` can be imported, without importing it (a None entry in sys.modules
    counts as missing; a module already there as present)."""
    if package in sys.modules:
        return sys.modules[package] is not None
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def validate_metric_writers(args, require) -> None:
    """``--tensorboard-dir``/``--wandb-project`` find their package, and wandb's other flags
    come with ``--wandb-project``; checked at start-up on every rank (only the last rank writes,
    maybe after set-up that took long)."""
    for flag, value in (("--wandb-exp-name", args.wandb_exp_name),
                        ("--wandb-save-dir", args.wandb_save_dir)):
        require(value is None or args.wandb_project is not None,
                f"{flag} {value!r} needs --wandb-project (the wandb project to log to)")
    given = {"--tensorboard-dir": args.tensorboard_dir, "--wandb-project": args.wandb_project}
    for flag, package in WRITER_PACKAGES.items():
        require(given[flag] is None or is_importable(package),
                f"{flag} needs the {package!r} package: pip install {package} (or the "
                f"[metrics] extra), or drop {flag}")
