"""Set-up helpers of the facade: its run from the config tree, device check, checkpoint paths."""

from __future__ import annotations

import dataclasses
import os
import re

import torch

from megatron.varlen_training import log
from megatron.varlen_training.config import RunConfig
from megatron.varlen_training.errors import CheckpointError
from megatron.varlen_training.config.from_flags import run_config as run_config_from_flags
from megatron.varlen_training.flag_values import parse_values
from megatron.wrap.config import ConfigError, WrapConfig
from megatron.wrap.metric_writers import facade_logging_config

_CHECKPOINT_DIR = re.compile(r"iter_(\d{7})$")
# pretrain_gpt.py's flags for when ITS loop stops. The facade has no loop (the caller's loop
# calls train()), so a config setting one would be ignored without a word: it is refused.
LOOP_EXIT_KEYS = ("exit_signal_handler", "exit_interval", "exit_duration_in_mins")
# pretrain_gpt.py's flags for what ITS loop evaluates: the facade's evaluate() gets the caller's
# batches, so a config setting one would be ignored without a word: refused too.
LOOP_EVALUATION_KEYS = ("skip_train", "full_validation", "multiple_validation_sets")
# pretrain_gpt.py's flags for the documents inside its pretraining samples: the facade's
# samples come from the caller (a flow decides their loss mask), so these are refused too.
DOCUMENT_KEYS = ("reset_position_ids", "reset_attention_mask", "eod_mask_loss",
                 "document_piece_length")
# pretrain_gpt.py's writer flag whose facade twin has another name: the facade's writers come
# from its logging keys, so the flag would be dropped without a word.
WRITER_FLAGS = {"log_metrics_jsonl": "set logging.metrics_jsonl_path and add 'jsonl' to "
                                     "logging.metric_writers"}
# pretrain_gpt.py's batch-size ramp-up: the facade's global batches come from the caller, so
# it would have nothing to size.
BATCH_RAMPUP_KEYS = ("rampup_batch_size", "decrease_batch_size_if_needed")
FACADE_LOG_INTERVAL = 1  # without log_interval in the config: the line at every call


def run_config_of(config: WrapConfig, world_size: int) -> tuple[RunConfig, bool]:
    """``(the run, whether the console metric writer is on)`` a :class:`WrapConfig` describes,
    built from its values directly (``flag_values.parse_values``: pretrain_gpt.py's flags,
    their checks and validation, without a command line) and its facade logging keys.

    The facade always packs (``sequence_packing``; the per-token loss comes with it). The
    validation insists on a data source; the facade feeds the caller's samples, so when the
    config names none ``mock_data`` is set, which nothing then reads.

    Raises:
        ArgumentValidationError: A bad flag value or combination (a one-line ValueError).
        ConfigError: A loop-exit or loop-evaluation key (:data:`LOOP_EXIT_KEYS`,
            :data:`LOOP_EVALUATION_KEYS`).
        ValueError, ImportError: A metric writer without its setting or package.
    """
    flat = dict(config.flat)
    refuse_loop_exit_keys(flat)
    refuse_loop_evaluation_keys(flat)
    refuse_document_keys(flat)
    refuse_writer_flags(flat)
    refuse_batch_rampup_keys(flat)
    flat["sequence_packing"] = True
    if not flat.get("mock_data") and not flat.get("data_path"):
        flat["mock_data"] = True
    samples_per_pack = micro_batch_as_budget(flat)
    logging, console = facade_logging_config(config.facade)
    run = run_config_from_flags(parse_values(flat, world_size=world_size))
    if samples_per_pack > 1:
        flat["max_seqlen_per_dp_cp_rank"] = \
            samples_per_pack * run.packing.max_seqlen_per_dp_cp_rank
        run = run_config_from_flags(parse_values(flat, world_size=world_size))
        log.print_rank_0(
            "micro_batch_size %d: packs of up to %d tokens per rank (max_seqlen_per_dp_cp_rank, "
            "%d full-length samples' worth); the packs of a step are its micro-batches",
            samples_per_pack, run.packing.max_seqlen_per_dp_cp_rank, samples_per_pack)
    # The caller's loop hands each step its batch, of any size (RL batches vary).
    training = dataclasses.replace(run.training, runtime_batches=True)
    # The facade's writers come from its keys; what they write, and how often the console
    # line is printed (log_interval, when the config sets it), from the flags.
    interval = FACADE_LOG_INTERVAL if flat.get("log_interval") is None \
        else run.logging.log_interval
    logging = dataclasses.replace(logging, log_interval=interval,
                                  **{name: getattr(run.logging, name)
                                     for name in FLAG_LOGGING_FIELDS})
    return dataclasses.replace(run, logging=logging, training=training), console


FLAG_LOGGING_FIELDS = (
    "log_validation_ppl_to_tensorboard", "tensorboard_log_interval", "log_num_zeros_in_grad",
    "log_params_norm", "timing_log_level", "timing_log_option", "log_timers_to_tensorboard",
    "log_throughput", "barrier_with_L1_time", "tensorboard_queue_size",
    "log_loss_scale_to_tensorboard", "log_world_size_to_tensorboard", "moe_per_layer_logging",
    "log_memory_to_tensorboard", "log_memory_interval", "log_device_memory_used", "log_progress")
"""LoggingConfig fields of Megatron-LM's logging flags: the facade's run takes them from the
parsed flags (what its writers write), its own keys pick the writers and where they write."""


def micro_batch_as_budget(flat: dict) -> int:
    """``micro_batch_size`` > 1 becomes the packing budget of that many full-length samples.

    With sequence packing a micro-batch is one pack of up to ``max_seqlen_per_dp_cp_rank``
    tokens per rank (its default: one ``seq_length`` sample per CP group), so Megatron-LM's
    "k samples per micro-batch" is honoured as a budget k times the default. Sets
    ``micro_batch_size`` to 1 in ``flat`` and returns k (1: nothing to do).

    Raises:
        ConfigError: Both keys are set: they would size the micro-batch twice.
    """
    samples = flat.get("micro_batch_size")
    if not isinstance(samples, int) or isinstance(samples, bool) or samples <= 1:
        return 1  # 1, unset, or a bad value that parse_values reports naming the flag
    if flat.get("max_seqlen_per_dp_cp_rank") is not None:
        raise ConfigError(
            f"config keys 'micro_batch_size' ({samples}) and 'max_seqlen_per_dp_cp_rank' "
            f"({flat['max_seqlen_per_dp_cp_rank']}) both size a micro-batch; with sequence "
            f"packing it is one pack of max_seqlen_per_dp_cp_rank tokens per rank: remove "
            f"micro_batch_size (or set it to 1)")
    flat["micro_batch_size"] = 1
    return samples


def refuse_loop_exit_keys(flat: dict) -> None:
    """A config key of :data:`LOOP_EXIT_KEYS` set (not None/False), or a one-line ConfigError."""
    for key in LOOP_EXIT_KEYS:
        if flat.get(key) not in (None, False):
            raise ConfigError(
                f"config key {key!r} ({flat[key]!r}) is pretrain_gpt.py's loop flag and has no "
                f"effect in megatron.wrap, whose loop is yours: remove it, and stop your loop "
                f"(then call save()) where the run should stop")


def refuse_loop_evaluation_keys(flat: dict) -> None:
    """A config key of :data:`LOOP_EVALUATION_KEYS` set: a one-line ConfigError."""
    for key in LOOP_EVALUATION_KEYS:
        if flat.get(key):
            raise ConfigError(
                f"config key {key!r} ({flat[key]!r}) is pretrain_gpt.py's evaluation flag and "
                f"has no effect in megatron.wrap, whose loop is yours: remove it, and call "
                f"evaluate() on the batches to evaluate")


def refuse_writer_flags(flat: dict) -> None:
    """A pretrain_gpt.py writer flag of :data:`WRITER_FLAGS` set: a one-line ConfigError."""
    for key, fix in WRITER_FLAGS.items():
        if flat.get(key) is not None:
            raise ConfigError(
                f"config key {key!r} ({flat[key]!r}) is pretrain_gpt.py's flag and has no "
                f"effect in megatron.wrap, whose metric writers its logging section names: "
                f"{fix}")


def refuse_document_keys(flat: dict) -> None:
    """A config key of :data:`DOCUMENT_KEYS` set, or ``packing_unit`` other than ``sample``: a
    one-line ConfigError (the facade reads no pretraining samples for them to act on)."""
    for key in DOCUMENT_KEYS + ("packing_unit",):
        if flat.get(key) not in (None, False, "sample"):
            raise ConfigError(
                f"config key {key!r} ({flat[key]!r}) acts on pretrain_gpt.py's pretraining "
                f"samples and has no effect in megatron.wrap, whose samples are yours: remove "
                f"it, and give your samples the loss mask you want (each sample is packed as "
                f"one sequence)")


def refuse_batch_rampup_keys(flat: dict) -> None:
    """A config key of :data:`BATCH_RAMPUP_KEYS` set: a one-line ConfigError."""
    for key in BATCH_RAMPUP_KEYS:
        if flat.get(key) is not None and flat.get(key) is not False:  # 0 is a value too
            raise ConfigError(
                f"config key {key!r} ({flat[key]!r}) sizes pretrain_gpt.py's global batches and "
                f"has no effect in megatron.wrap, whose batches are yours: remove it, and hand "
                f"train() the batch of each step at the size you want (the LR schedule and the "
                f"consumed samples follow each batch's samples)")


def check_device(device: str) -> None:
    """``wrap.device`` must match what the device layer will use (CUDA if visible, else CPU)."""
    has_cuda = torch.cuda.is_available()
    if device == "cuda" and not has_cuda:
        raise ConfigError("config key 'wrap.device' is 'cuda' but no CUDA device is visible")
    if device == "cpu" and has_cuda:
        raise ConfigError("config key 'wrap.device' is 'cpu' but CUDA is visible: set "
                         "CUDA_VISIBLE_DEVICES= to run on CPU, or use 'auto'")


def checkpoint_location(path: str) -> tuple[str, int | None]:
    """Where ``path`` points: its checkpoint root and the iteration it names. A root
    (``--save``/``--load`` dir) names none (its latest, or ``step``, is loaded); an
    ``iter_NNNNNNN`` folder (what ``save()`` returns) names its own, latest or not, as
    ``pretrain_gpt.py --load ROOT --ckpt-step N`` loads it.

    Raises:
        CheckpointError: ``path`` does not exist.
    """
    path = os.path.normpath(path)
    if not os.path.isdir(path):
        raise CheckpointError(f"checkpoint path {path!r} does not exist")
    match = _CHECKPOINT_DIR.search(os.path.basename(path))
    if match is None:
        return path, None
    return os.path.dirname(path), int(match.group(1))


WANDB_ENTITY_ENV = "WANDB_ENTITY"  # wandb.init reads the entity (team) from it
IGNORED_KEYS_LISTED = 12  # longer groups of dropped keys are logged as a count, not a wall


def apply_wandb_entity(facade: dict) -> None:
    """``logging.wandb_entity`` (megatron-wrap's ``wandb_entity``) reaches wandb through its
    environment variable; one already set by the user wins."""
    if facade.get("wandb_entity"):
        os.environ.setdefault(WANDB_ENTITY_ENV, str(facade["wandb_entity"]))


def log_ignored_keys(ignored: dict[str, str]) -> None:
    """One line per reason for the keys of a megatron-wrap config that change nothing here
    (``WrapConfig.ignored``); the long list of keys at their defaults only as a count."""
    by_reason: dict[str, list[str]] = {}
    for key, reason in ignored.items():
        by_reason.setdefault(reason, []).append(key)
    for reason, keys in by_reason.items():
        if len(keys) > IGNORED_KEYS_LISTED:
            log.print_rank_0("megatron-wrap config: %d keys dropped (%s); WrapConfig.ignored "
                             "lists them", len(keys), reason)
        else:
            log.print_rank_0("megatron-wrap config: dropped %s (%s)", ", ".join(keys), reason)
