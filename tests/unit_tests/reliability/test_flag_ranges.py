"""Every numeric flag refuses 0, -1, NaN, infinity and a huge value in one line
(exit code 2) unless the value is valid for it -- on pretrain_gpt.py, pretrain_mamba.py and the
MegatronWrap facade. The flags are enumerated from the parsers themselves, so a new numeric
flag fails test_every_numeric_flag_is_classified until someone writes down its valid probes."""

import copy
import functools
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from megatron.varlen_training import arguments, flag_ranges, flag_values, hybrid_arguments
from megatron.varlen_training.arguments import ArgumentValidationError, build_parser, parse_args
from megatron.varlen_training.config.from_flags import run_config
from megatron.varlen_training.datasets.builder import build_datasets
from megatron.varlen_training.errors import UserInputError, agree_on_errors
from megatron.varlen_training.hybrid_arguments import build_hybrid_parser, parse_hybrid_args
from megatron.wrap import runtime
from megatron.wrap.config import build_config
from tests.harness.training_runs import TINY_GPT_ARGS, tiny_packed_config

REPO = Path(__file__).resolve().parents[3]
HUGE_INT = 10**12
HUGE_FLOAT = 1e30
PROBES = ("0", "-1", "nan", "inf", "huge")
ZERO, HUGE = frozenset({"0"}), frozenset({"huge"})
ZERO_OR_HUGE = ZERO | HUGE
NONE = frozenset()

# Flag dest -> the probes it accepts (on every base command below); every other probe must be
# a one-line error. NaN and infinity are never valid (an int flag refuses them as text). A huge
# value is valid only where it is legitimately usable: a rate, a decay, an interval that is
# never reached. Sizes refuse it (memory, int32 sequence boundaries, divisibility).
VALID = {
    "num_layers": NONE,
    "hidden_size": NONE,
    "ffn_hidden_size": NONE,
    "num_attention_heads": NONE,
    "num_query_groups": NONE,
    "seq_length": NONE,
    "max_position_embeddings": NONE,
    "rotary_base": HUGE,
    "mtp_num_layers": NONE,
    "make_vocab_size_divisible_by": NONE,
    "init_method_std": HUGE,
    "hidden_dropout": ZERO,
    "attention_dropout": ZERO,
    "micro_batch_size": NONE,
    "global_batch_size": NONE,
    "train_iters": HUGE,  # mock data then refuses it where its sample index is built
    "seed": ZERO,
    "clip_grad": ZERO_OR_HUGE,
    "weight_decay": ZERO_OR_HUGE,
    "adam_beta1": ZERO,
    "adam_beta2": ZERO,
    "adam_eps": HUGE,
    "lr": ZERO_OR_HUGE,
    "min_lr": ZERO,
    # Alone --decoupled-min-lr is refused (it needs --decoupled-lr) whatever its value.
    "decoupled_lr": ZERO_OR_HUGE,
    "decoupled_min_lr": NONE,
    "timing_log_level": ZERO,
    "lr_decay_iters": HUGE,
    "lr_warmup_iters": ZERO,
    # The bases are iteration-based: the sample-based flags are refused there (one kind of
    # schedule), but for their defaults; a warm-up fraction must stay below 1.
    "train_samples": NONE,
    "lr_decay_samples": NONE,
    "lr_warmup_samples": ZERO,
    "lr_warmup_fraction": ZERO,
    # The bases decay linearly with constant weight decay: the WSD lengths and the weight-decay
    # ramp's ends are refused there whatever their value; the warm-up start must stay <= --lr.
    "lr_warmup_init": ZERO,
    "lr_wsd_decay_iters": NONE,
    "lr_wsd_decay_samples": NONE,
    "start_weight_decay": NONE,
    "end_weight_decay": NONE,
    # The bases have no --fp16: a loss-scaler value other than Megatron-LM's default is refused.
    "loss_scale": NONE,
    "initial_loss_scale": NONE,
    "min_loss_scale": NONE,
    "loss_scale_window": NONE,
    "hysteresis": NONE,
    "tensor_model_parallel_size": NONE,
    "pipeline_model_parallel_size": NONE,
    "num_layers_per_virtual_pipeline_stage": NONE,
    "context_parallel_size": NONE,
    "vocab_size": NONE,
    "padded_vocab_size": NONE,  # below the base's --vocab-size 128, or beyond the memory limit
    "tiktoken_num_special_tokens": NONE,  # >= 7, and refused beside another type than TikToken
    "log_interval": HUGE,
    "tensorboard_log_interval": HUGE,
    "tensorboard_queue_size": HUGE,  # events held before a flush: a huge queue flushes at close
    # CUDA only: refused without CUDA whatever its value; with it an interval like the others
    "log_memory_interval": HUGE if torch.cuda.is_available() else NONE,
    "moe_routing_trace_max_training_iters": NONE,  # a refused flag
    "eval_interval": HUGE,
    "eval_iters": ZERO_OR_HUGE,  # as train_iters
    "save_interval": HUGE,
    "ckpt_step": NONE,  # the base commands load nothing: every --ckpt-step is refused
    "non_persistent_save_interval": NONE,  # refused whatever its value
    "num_workers": ZERO,  # reads in the training process; a huge count would fork a host away
    "min_dynamic_context_parallel_size": NONE,
    "max_seqlen_per_dp_cp_rank": NONE,
    "thd_max_packed_sequences": NONE,  # huge: above what a pack can hold (and needs packing)
    "document_piece_length": NONE,  # needs --packing-unit document, at most the longest sequence
    "kv_channels": NONE,
    "norm_epsilon": HUGE,
    "rope_scaling_factor": HUGE,
    # Megatron-LM's RoPE flags need --position-embedding-type rope (the bases use learned
    # positions); the uneven-pipeline and virtual-stage flags need
    # --pipeline-model-parallel-size > 1 (the bases have one stage).
    "rotary_percent": NONE,
    "mtp_loss_scaling_factor": NONE,  # needs --mtp-num-layers (the bases have none)
    "rotary_seq_len_interpolation_factor": NONE,
    "decoder_first_pipeline_num_layers": NONE,
    "glu_linear_offset": ZERO,  # Megatron-LM's 0.0 changes nothing; every other value refused
    "activation_func_clamp_value": NONE,
    "embedding_init_method_std": NONE,
    "moe_input_jitter_eps": NONE,
    "moe_latent_size": NONE,
    # the MLA shape flags need --multi-latent-attention (the bases have none): only
    # Megatron-LM's defaults pass (mscale_all_dim's is 0); the --yarn-* flags are refused
    "q_lora_rank": NONE,
    "kv_lora_rank": NONE,
    "qk_head_dim": NONE,
    "qk_pos_emb_head_dim": NONE,
    "v_head_dim": NONE,
    "rotary_scaling_factor": NONE,
    "mscale": NONE,
    "mscale_all_dim": ZERO,
    "yarn_original_max_position_embeddings": NONE,
    "yarn_beta_fast": NONE,
    "yarn_beta_slow": NONE,
    "fp8_margin": ZERO,  # Megatron-LM's 0 changes nothing; every other value refused
    "fp8_interval": NONE,
    "fp8_amax_history_len": NONE,
    "batch_size": NONE,  # removed flags: Megatron-LM refuses any value
    "warmup": NONE,
    "model_parallel_size": NONE,
    "decoder_last_pipeline_num_layers": NONE,
    "num_virtual_stages_per_pipeline_rank": NONE,
    # read by the interleaved schedule only: without virtual stages any group is unused
    # (Megatron-LM too); with them pipeline_arguments.py bounds it by PP and the step
    "microbatch_group_size_per_vp_stage": HUGE,
    "distributed_timeout_minutes": NONE,
    "exit_interval": HUGE,
    "exit_duration_in_mins": HUGE,
    "hybrid_attention_ratio": ZERO,
    "hybrid_mlp_ratio": ZERO,
    "mamba_state_dim": NONE,
    "mamba_head_dim": NONE,
    "mamba_num_groups": NONE,
    "mamba_num_heads": NONE,
    # Each base has 2 layers per chunk: 0 and huge exceed or undercut them.
    "recompute_num_layers": NONE,
    # MoE (moe_arguments.py): the bases have no --num-experts, so every MoE flag away from its
    # default is refused (it would be silently ignored); --moe-aux-loss-coeff defaults to 0.
    "num_experts": NONE,  # the bases keep linear biases, which MoE layers refuse
    "moe_router_topk": NONE,
    "moe_ffn_hidden_size": NONE,
    "moe_shared_expert_intermediate_size": NONE,
    "expert_model_parallel_size": NONE,
    "expert_tensor_parallel_size": NONE,
    "moe_aux_loss_coeff": ZERO,
    "moe_z_loss_coeff": NONE,
    "moe_router_topk_scaling_factor": NONE,
    "moe_expert_capacity_factor": NONE,
    "moe_router_bias_update_rate": NONE,  # 0 differs from its default 1e-3
    "moe_router_num_groups": NONE,
    "moe_router_group_topk": NONE,
    # runtime (runtime_arguments.py): 0 never collects; a huge interval is never reached. The
    # profile window needs --profile to be checked (the bases profile nothing); a profiled rank
    # must be one of the job's (the bases have one rank); any logging level is Python's.
    "manual_gc_interval": ZERO,  # needs --manual-gc (the bases have none) unless 0
    "empty_unused_memory_level": ZERO,
    "profile_step_start": ZERO_OR_HUGE,
    "profile_step_end": HUGE,
    "profile_ranks": ZERO,
    "logging_level": ZERO_OR_HUGE,
    # refused families: only the neutral value passes (none of the probes is one)
    "straggler_ctrlr_port": NONE,
    "straggler_minmax_count": NONE,
    "ft_num_warmup_iters": NONE,
    "error_injection_rate": ZERO,  # Megatron-LM's 0 injects nothing; every other rate refused
    "check_weight_hash_across_dp_replicas_interval": NONE,
    "inprocess_max_iterations": NONE,
    "inprocess_active_world_size": NONE,
    **dict.fromkeys(("inprocess_monitor_thread_interval", "inprocess_monitor_process_interval",
                     "inprocess_progress_watchdog_interval", "inprocess_heartbeat_interval",
                     "inprocess_soft_timeout", "inprocess_hard_timeout",
                     "inprocess_heartbeat_timeout", "inprocess_barrier_timeout",
                     "inprocess_completion_timeout", "inprocess_last_call_wait",
                     "inprocess_termination_grace_time"), NONE),
    # optimizer choice (optimizer_arguments.py): SGD's momentum is any non-negative factor; the
    # Muon/Lion/offload tuning flags are read only by refused optimizers, typed sensibly.
    "sgd_momentum": ZERO_OR_HUGE,
    "muon_momentum": ZERO_OR_HUGE,
    "muon_num_ns_steps": HUGE,
    "muon_extra_scale_factor": ZERO_OR_HUGE,
    "lion_beta1": ZERO,
    "lion_beta2": ZERO,
    "optimizer_offload_fraction": ZERO,
    # DDP (ddp_arguments.py): bucket sizes apply with --overlap-grad-reduce only; one
    # distributed-optimizer instance only; the FSDP-only unit size is read by refused FSDP.
    "ddp_bucket_size": HUGE,
    "ddp_num_buckets": HUGE,
    "num_distributed_optimizer_instances": NONE,
    "suggested_communication_unit_size": HUGE,
    "megatron_fsdp_version": NONE,
    "distributed_timeout_seconds_after_init": NONE,
    "local_rank": ZERO,  # $LOCAL_RANK is 0 (unset) in these tests
    # checkpoint flags refused whatever their value (checkpoint_save_arguments.py)
    "replication_jump": NONE,
    "replication_factor": NONE,
    "save_retain_interval": NONE,
    "save_wgrads_interval": NONE,
    "save_dgrads_interval": NONE,
    "dist_ckpt_workers": NONE,
    "override_ckpt_iteration": NONE,
    # training-loop flags refused whatever their value (training_loop_arguments.py)
    "train_sync_interval": NONE,
    # --rampup-batch-size takes three values (one is an argparse error) and needs
    # --train-samples (the bases are iteration-based): test_batch_rampup.py has its ranges.
    "rampup_batch_size": NONE,
    # dataset builder (dataloader_arguments.py); the FIM rates are read only by refused FIM.
    "num_dataset_builder_threads": HUGE,
    "mid_level_dataset_surplus": ZERO,
    "fim_rate": ZERO,
    "fim_spm_rate": ZERO,
    "fim_fragment_rate": ZERO,
    # evaluation flags (validation_arguments.py): --eval-micro-batch-size accepted only at the
    # training one (none of the probes), --decoder-seq-length refused whatever its value
    "eval_micro_batch_size": NONE,
    "eval_global_batch_size": HUGE,  # read by no evaluation at the base's --eval-iters 0
    "start_eval_at_iter": ZERO_OR_HUGE,  # 0 changes nothing; a huge one never evaluates
    "decoder_seq_length": NONE,
}

GPT_BASE = TINY_GPT_ARGS + ["--train-iters", "3"]
MAMBA_BASE = TINY_GPT_ARGS + ["--train-iters", "3", "--num-layers", "3",
                              "--hybrid-override-pattern", "M*-", "--mamba-head-dim", "8",
                              "--mamba-num-groups", "2", "--mamba-state-dim", "8"]


def _numeric_dests(parser) -> dict:
    return {action.dest: action.type for action in parser.flag_actions
            if action.type in (int, float)}


GPT_FLAGS = _numeric_dests(build_parser())
MAMBA_FLAGS = _numeric_dests(build_hybrid_parser())


def _value(kind, probe: str):
    return {"0": 0, "-1": -1, "nan": math.nan, "inf": math.inf,
            "huge": HUGE_INT if kind is int else HUGE_FLOAT}[probe]


def _flag(dest: str) -> str:
    return flag_ranges.flag_name(dest)  # the dest spelt with dashes, but for renamed dests


def _cli_outcome(parse, base: list[str], dest: str, value):
    """(accepted args or None, the one-line error or None)."""
    try:
        return parse(base + [f"{_flag(dest)}={value}"], world_size=1), None
    except ArgumentValidationError as err:
        return None, str(err)


def _check(dest: str, probe: str, args, error: str | None) -> None:
    if probe in VALID[dest]:
        assert error is None, f"{_flag(dest)} {probe} was refused: {error}"
    else:
        assert args is None, f"{_flag(dest)} {probe} was accepted"
        assert error and "\n" not in error, error


def test_every_numeric_flag_is_classified():
    """A new int/float flag must get a range and a row in VALID (a reviewed decision)."""
    numeric = set(GPT_FLAGS) | set(MAMBA_FLAGS)
    assert sorted(numeric - set(VALID)) == [], "numeric flags missing from VALID"
    assert sorted(numeric - set(flag_ranges.FLAG_RANGES)) == [], "missing from FLAG_RANGES"
    assert sorted(set(VALID) - numeric) == [] and sorted(
        set(flag_ranges.FLAG_RANGES) - numeric) == [], "stale entries"


def _accepted_then_data_is_one_line_or_builds(args) -> None:
    """An accepted value must not fail later in a traceback: the datasets (mock data's sample
    index is sized by the flags) build or refuse in one line."""
    try:
        agree_on_errors(build_datasets, run_config(args), None)
    except UserInputError as err:
        assert "\n" not in str(err)


# The sweeps' ~2,500 parses share one parser per entry point: each parse builds a fresh
# ~700-flag parser (so that --hf-checkpoint and --use-checkpoint-args can set its defaults,
# which no probe here gives), most of the sweeps' time. The entry points' own code runs
# otherwise unchanged; test_shared_parsers_parse_as_fresh_ones holds them to fresh parsers.
_SHARED_BUILDERS = ((arguments, "build_parser"), (flag_values, "build_parser"),
                    (hybrid_arguments, "build_hybrid_parser"))
_SHARED = {(module, name): functools.lru_cache(maxsize=None)(getattr(module, name))
           for module, name in _SHARED_BUILDERS}


@pytest.fixture
def shared_parsers(monkeypatch):
    """parse_args, parse_hybrid_args and the facade's parse_values each reuse one parser."""
    for (module, name), shared in _SHARED.items():
        monkeypatch.setattr(module, name, shared)


@pytest.mark.parametrize("dest", sorted(GPT_FLAGS))
def test_pretrain_gpt_numeric_flags(dest, shared_parsers):
    for probe in PROBES:
        args, error = _cli_outcome(parse_args, GPT_BASE, dest, _value(GPT_FLAGS[dest], probe))
        _check(dest, probe, args, error)
        if args is not None:
            _accepted_then_data_is_one_line_or_builds(args)


@pytest.mark.parametrize("dest", sorted(MAMBA_FLAGS))
def test_pretrain_mamba_numeric_flags(dest, shared_parsers):
    for probe in PROBES:
        args, error = _cli_outcome(parse_hybrid_args, MAMBA_BASE, dest,
                                   _value(MAMBA_FLAGS[dest], probe))
        _check(dest, probe, args, error)


def _facade_config(dest: str, value) -> dict:
    config = copy.deepcopy(tiny_packed_config(global_batch_size=4, train_iters=3))
    section = next((name for name, keys in config.items() if dest in keys), "training")
    config.setdefault(section, {})[dest] = value
    return config


# pretrain_gpt.py's loop, ramp-up and document flags: the facade's loop, batches and samples are
# the caller's, so it refuses them in one line (tests/unit_tests/reliability/
# test_exit_conditions.py, varlen_training/test_document_arguments.py).
FACADE_REFUSED = frozenset({"exit_interval", "exit_duration_in_mins", "rampup_batch_size",
                            "document_piece_length"})


@pytest.mark.parametrize("dest", sorted(set(GPT_FLAGS) - FACADE_REFUSED))
def test_facade_numeric_flags(dest, shared_parsers):
    """MegatronWrap builds its run from the config tree with the same flag checks and
    validation: the same table holds (its base always packs)."""
    for probe in PROBES:
        args, error = _facade_outcome(dest, probe)
        _check(dest, probe, args, error)


def _facade_outcome(dest: str, probe: str):
    config = build_config(_facade_config(dest, _value(GPT_FLAGS[dest], probe)))
    try:
        return runtime.run_config_of(config, world_size=1), None
    except ArgumentValidationError as err:
        return None, str(err)


def _outcomes(dests: list[str]) -> list:
    """Every probe of ``dests`` on the three entry points, as the sweeps parse them."""
    outcomes = []
    for dest in dests:
        for probe in PROBES:
            outcomes.append(_cli_outcome(parse_args, GPT_BASE, dest,
                                         _value(GPT_FLAGS[dest], probe)))
            if dest in MAMBA_FLAGS:
                outcomes.append(_cli_outcome(parse_hybrid_args, MAMBA_BASE, dest,
                                             _value(MAMBA_FLAGS[dest], probe)))
            if dest not in FACADE_REFUSED:
                outcomes.append(_facade_outcome(dest, probe))
    return outcomes


# Every EQUIVALENCE_STRIDE-th numeric flag, and of those with a valid probe, in the sweeps'
# order: accepted and refused probes.
EQUIVALENCE_STRIDE = 30


def test_shared_parsers_parse_as_fresh_ones(monkeypatch):
    """The shared parsers accept and refuse as fresh ones do, with the same namespace, run
    config or error, also after the parses before them: a parse leaves nothing behind."""
    dests = (sorted(GPT_FLAGS)[::EQUIVALENCE_STRIDE]
             + [dest for dest in sorted(GPT_FLAGS) if VALID[dest]][::EQUIVALENCE_STRIDE])
    fresh = _outcomes(dests)
    for (module, name), shared in _SHARED.items():
        monkeypatch.setattr(module, name, shared)
    assert _outcomes(dests) == fresh
    assert {args is None for args, _ in fresh} == {True, False}


# --- the values once accepted, each named ------------------------------------------------


@pytest.mark.parametrize("extra, needle", [
    (["--min-lr", "0.1", "--lr", "0.01"], "--min-lr 0.1 exceeds --lr 0.01"),
    (["--adam-beta1", "1.5"], "--adam-beta1 must be a finite number in [0, 1) (got 1.5)"),
    (["--hidden-dropout", "1.5"], "--hidden-dropout must be a finite number in [0, 1) (got 1.5)"),
    (["--attention-dropout", "1.0"], "--attention-dropout must be a finite number in [0, 1)"),
    (["--lr", "nan"], "--lr must be a finite number >= 0 (got nan)"),
    (["--hidden-size", "64", "--num-attention-heads", "3"],
     "--hidden-size 64 is not divisible by --num-attention-heads 3"),
    (["--group-query-attention", "--num-query-groups", "3"],
     "--num-attention-heads 4 is not divisible by --num-query-groups 3"),
])
def test_observed_bad_values_are_one_line(extra, needle):
    with pytest.raises(ArgumentValidationError) as err:
        parse_args(GPT_BASE + extra, world_size=1)
    assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_kv_channels_lifts_the_head_divisibility_rule():
    """As Megatron-LM: with an explicit head dimension, heads need not divide the hidden size."""
    args = parse_args(GPT_BASE + ["--hidden-size", "64", "--num-attention-heads", "3",
                                  "--kv-channels", "16"], world_size=1)
    assert args.kv_channels == 16


def test_huge_vocabulary_is_refused_by_the_memory_limit(monkeypatch):
    monkeypatch.setattr(flag_ranges, "host_memory_bytes", lambda: 64 * flag_ranges.GIB)
    _, error = _cli_outcome(parse_args, GPT_BASE + ["--hidden-size", "64"], "vocab_size",
                            10**9)
    assert error.startswith("--vocab-size 1000000000 (padded to 1000000000) x --hidden-size 64: "
                            "the word embedding take(s) at least 238.4 GiB on one rank"), error
    assert "above this machine's 64.0 GiB of memory" in error
    # TP shards the embedding: 4 ranks hold a quarter each (59.6 GiB), which fits.
    args = parse_args(GPT_BASE + ["--hidden-size", "64", "--vocab-size", str(10**9),
                                  "--tensor-model-parallel-size", "4"], world_size=4)
    assert args.padded_vocab_size == 10**9


@pytest.mark.parametrize("make_path, needle", [
    (lambda tmp: tmp, "is a directory; name a file in it"),
    (lambda tmp: _file(tmp) / "metrics.jsonl", "is a file, not a directory"),
])
def test_unusable_metrics_jsonl_is_one_line(tmp_path, make_path, needle):
    path = make_path(tmp_path)
    _, error = _cli_outcome(parse_args, GPT_BASE, "log_metrics_jsonl", path)
    assert error.startswith(f"--log-metrics-jsonl {str(path)!r} ") and needle in error, error


def test_metrics_jsonl_in_a_new_folder_is_accepted(tmp_path):
    """The writer creates missing parent folders; nothing is created at start-up."""
    path = tmp_path / "new" / "metrics.jsonl"
    parse_args(GPT_BASE + ["--log-metrics-jsonl", str(path)], world_size=1)
    assert not path.parent.exists()


def _file(tmp_path: Path) -> Path:
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    return blocker


def test_huge_mock_sample_count_is_one_line():
    args = parse_args(GPT_BASE + ["--train-iters", str(HUGE_INT)], world_size=1)
    with pytest.raises(UserInputError) as err:
        agree_on_errors(build_datasets, run_config(args), None)
    assert "--mock-data keeps one length per sample" in str(err.value)


# --- end to end: real processes, exit code 2, one line -------------------------------------


def _run(script: str, argv: list[str], env_extra=None):
    env = {"PATH": "/usr/bin:/bin", "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1",
           "WORLD_SIZE": "1", **(env_extra or {})}
    return subprocess.run([sys.executable, str(REPO / script), *argv], capture_output=True,
                          text=True, timeout=120, env=env, cwd=REPO)


@pytest.mark.parametrize("script, base, extra, needle", [
    ("pretrain_gpt.py", GPT_BASE, ["--min-lr", "0.1", "--lr", "0.01"], "--min-lr 0.1 exceeds"),
    ("pretrain_gpt.py", GPT_BASE, ["--adam-beta1", "1.5"], "--adam-beta1 must be"),
    ("pretrain_gpt.py", GPT_BASE, ["--lr", "nan"], "--lr must be a finite number"),
    ("pretrain_gpt.py", GPT_BASE, ["--vocab-size", str(HUGE_INT)], "the word embedding"),
    ("pretrain_mamba.py", MAMBA_BASE, ["--hidden-dropout", "1.5"], "--hidden-dropout must be"),
])
def test_entry_points_exit_2_with_one_line(script, base, extra, needle):
    proc = _run(script, base + extra)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith(f"{script}: error: ") and needle in lines[0], \
        proc.stderr
