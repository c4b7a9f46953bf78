"""Set-up helpers of the facade: flags, device check, metric writers, checkpoint paths."""

from __future__ import annotations

import os
import re

import torch
import torch.distributed as dist

from megatron.varlen_training import checkpointing
from megatron.varlen_training.arguments import build_parser, parse_args
from megatron.varlen_training.config import RunConfig
from megatron.varlen_training.config.from_flags import run_config
from megatron.wrap.config import ConfigError, flat_config_to_argv
from megatron.wrap.metric_writers import build_metric_writers

_CHECKPOINT_DIR = re.compile(r"iter_(\d{7})$")
# pretrain_gpt.py's flags for when ITS loop stops. The facade has no loop (the caller's loop
# calls train()), so a config setting one would be ignored without a word: it is refused.
LOOP_EXIT_KEYS = ("exit_signal_handler", "exit_interval", "exit_duration_in_mins")


def parse_training_args(config) -> RunConfig:
    """The run of a :class:`WrapConfig`, validated by pretrain_gpt.py's parser.

    The facade always packs (``sequence_packing``; the per-token loss comes with it). The
    parser insists on a data source; the facade feeds the caller's samples, so when the config
    names none it passes ``--mock-data``, which nothing then reads.

    Raises:
        ArgumentValidationError: A bad flag or combination (a one-line ValueError).
    """
    flat = dict(config.flat)
    refuse_loop_exit_keys(flat)
    flat["sequence_packing"] = True
    if not flat.get("mock_data") and not flat.get("data_path"):
        flat["mock_data"] = True
    return run_config(parse_args(flat_config_to_argv(flat, build_parser()),
                                 world_size=dist.get_world_size()))


def refuse_loop_exit_keys(flat: dict) -> None:
    """A config key of :data:`LOOP_EXIT_KEYS` set (not None/False), or a one-line ConfigError."""
    for key in LOOP_EXIT_KEYS:
        if flat.get(key) not in (None, False):
            raise ConfigError(
                f"config key {key!r} ({flat[key]!r}) is pretrain_gpt.py's loop flag and has no "
                f"effect in megatron.wrap, whose loop is yours: remove it, and stop your loop "
                f"(then call save()) where the run should stop")


def check_device(device: str) -> None:
    """``wrap.device`` must match what the device layer will use (CUDA if visible, else CPU)."""
    has_cuda = torch.cuda.is_available()
    if device == "cuda" and not has_cuda:
        raise ValueError("config key 'wrap.device' is 'cuda' but no CUDA device is visible")
    if device == "cpu" and has_cuda:
        raise ValueError("config key 'wrap.device' is 'cpu' but CUDA is visible: set "
                         "CUDA_VISIBLE_DEVICES= to run on CPU, or use 'auto'")


def build_writers(facade: dict, run_config: dict, train_iters: int) -> list:
    """The metric writers on the last rank ([] elsewhere); a failure raises on EVERY rank.

    Only the last rank builds writers, so one broadcast tells the others whether it failed
    (a missing setting or package) instead of leaving them waiting in the next collective.
    """
    last = dist.get_world_size() - 1
    writers, error, message = [], None, [None]
    if dist.get_rank() == last:
        try:
            writers = build_metric_writers(
                facade["metric_writers"], train_iters=train_iters,
                tensorboard_dir=facade["tensorboard_dir"],
                wandb_project=facade["wandb_project"], wandb_exp_name=facade["wandb_exp_name"],
                wandb_save_dir=facade["wandb_save_dir"], wandb_mode=facade["wandb_mode"],
                jsonl_path=facade["metrics_jsonl_path"], run_config=run_config)
        except (ValueError, ImportError) as err:
            error, message = err, [f"{type(err).__name__}: {err}"]
    dist.broadcast_object_list(message, src=last)
    if error is not None:
        raise error
    if message[0] is not None:
        raise ValueError(f"rank {last} could not build the metric writers: {message[0]}")
    return writers


def checkpoint_root(path: str) -> str:
    """The checkpoint root of ``path``: a root (``--save``/``--load`` dir) or its latest
    ``iter_NNNNNNN`` folder (what ``save()`` returns).

    Raises:
        ValueError: ``path`` does not exist, or names an iteration that is not the latest.
    """
    path = os.path.normpath(path)
    if not os.path.isdir(path):
        raise ValueError(f"checkpoint path {path!r} does not exist")
    match = _CHECKPOINT_DIR.search(os.path.basename(path))
    if match is None:
        return path
    root = os.path.dirname(path)
    latest = checkpointing.read_latest_iteration(root)
    if latest != int(match.group(1)):
        raise ValueError(f"{path!r} is iteration {int(match.group(1))} but {root!r} records "
                         f"iteration {latest} as its latest; only the latest can be loaded")
    return root
