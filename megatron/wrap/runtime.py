"""Set-up helpers of the facade: its run from the config tree, device check, checkpoint paths."""

from __future__ import annotations

import dataclasses
import os
import re

import torch

from megatron.varlen_training import checkpointing
from megatron.varlen_training.config import RunConfig
from megatron.varlen_training.config.from_flags import run_config as run_config_from_flags
from megatron.varlen_training.flag_values import parse_values
from megatron.wrap.config import ConfigError, WrapConfig
from megatron.wrap.metric_writers import facade_logging_config

_CHECKPOINT_DIR = re.compile(r"iter_(\d{7})$")
# pretrain_gpt.py's flags for when ITS loop stops. The facade has no loop (the caller's loop
# calls train()), so a config setting one would be ignored without a word: it is refused.
LOOP_EXIT_KEYS = ("exit_signal_handler", "exit_interval", "exit_duration_in_mins")
# pretrain_gpt.py's flags for the documents inside its pretraining samples: the facade's
# samples come from the caller (a flow decides their loss mask), so these are refused too.
DOCUMENT_KEYS = ("reset_position_ids", "reset_attention_mask", "eod_mask_loss")


def run_config_of(config: WrapConfig, world_size: int) -> tuple[RunConfig, bool]:
    """``(the run, whether the console metric writer is on)`` a :class:`WrapConfig` describes,
    built from its values directly (``flag_values.parse_values``: pretrain_gpt.py's flags,
    their checks and validation, without a command line) and its facade logging keys.

    The facade always packs (``sequence_packing``; the per-token loss comes with it). The
    validation insists on a data source; the facade feeds the caller's samples, so when the
    config names none ``mock_data`` is set, which nothing then reads.

    Raises:
        ArgumentValidationError: A bad flag value or combination (a one-line ValueError).
        ConfigError: A loop-exit key (see :data:`LOOP_EXIT_KEYS`).
        ValueError, ImportError: A metric writer without its setting or package.
    """
    flat = dict(config.flat)
    refuse_loop_exit_keys(flat)
    refuse_document_keys(flat)
    flat["sequence_packing"] = True
    if not flat.get("mock_data") and not flat.get("data_path"):
        flat["mock_data"] = True
    logging, console = facade_logging_config(config.facade)
    run = run_config_from_flags(parse_values(flat, world_size=world_size))
    return dataclasses.replace(run, logging=logging), console


def refuse_loop_exit_keys(flat: dict) -> None:
    """A config key of :data:`LOOP_EXIT_KEYS` set (not None/False), or a one-line ConfigError."""
    for key in LOOP_EXIT_KEYS:
        if flat.get(key) not in (None, False):
            raise ConfigError(
                f"config key {key!r} ({flat[key]!r}) is pretrain_gpt.py's loop flag and has no "
                f"effect in megatron.wrap, whose loop is yours: remove it, and stop your loop "
                f"(then call save()) where the run should stop")


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


def check_device(device: str) -> None:
    """``wrap.device`` must match what the device layer will use (CUDA if visible, else CPU)."""
    has_cuda = torch.cuda.is_available()
    if device == "cuda" and not has_cuda:
        raise ValueError("config key 'wrap.device' is 'cuda' but no CUDA device is visible")
    if device == "cpu" and has_cuda:
        raise ValueError("config key 'wrap.device' is 'cpu' but CUDA is visible: set "
                         "CUDA_VISIBLE_DEVICES= to run on CPU, or use 'auto'")


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
