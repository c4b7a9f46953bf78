"""Which keys a config may hold: sections, facade-only keys, and the CLI keys of pretrain_gpt.py.

CLI keys are the argparse `dest` names of the training layer's parser (`--num-layers` ->
`num_layers`); they are not listed here but read from the parser, so the parser stays the one
source of truth for their defaults and validation. Facade-only keys are the few settings that
only `MegatronWrap` reads; they are declared below with defaults and allowed values.
"""

import argparse
import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

from megatron.wrap.config.errors import ConfigError, did_you_mean

SECTIONS = (
    "model",
    "parallel",
    "optimizer",
    "training",
    "data",
    "checkpoint",
    "logging",
    "flow",
    "wrap",
    "megatron",
)
"""Top-level keys of a config. Any CLI key may sit in any section; each only once.
`megatron` is where a megatron-wrap config's Megatron-LM keys land (config/nest_keys.py)."""

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
METRIC_WRITER_KINDS = ("console", "tensorboard", "wandb", "jsonl")
WANDB_MODES = ("auto", "online", "offline", "disabled")
DEVICES = ("auto", "cpu", "cuda")
BATCH_SOURCES = ("all_ranks", "rank0")
DEFAULT_FLOW = "gpt_sft"


@dataclasses.dataclass(frozen=True)
class FacadeKey:
    """A key only the facade reads (never passed to pretrain_gpt.py's parser).

    Attributes:
        name: The key, unique across all sections and CLI keys.
        section: The only section it may sit in.
        default: Its value when no config sets it.
        doc: One line for docs and `--help`-like listings.
        choices: Allowed values (for a list: allowed elements), or None for any.
    """

    name: str
    section: str
    default: Any
    doc: str
    choices: tuple[str, ...] | None = None


FACADE_KEYS = {
    key.name: key
    for key in (
        FacadeKey("flow_name", "flow", DEFAULT_FLOW,
                  "Registered flow that turns samples into model inputs and a loss."),
        FacadeKey("flow_args", "flow", {}, "Keyword arguments passed to the flow."),
        FacadeKey("ignored_fields", "flow", [],
                  "Sample keys the flow accepts without reading them (metadata such as ids); "
                  "any other key a sample has and the flow does not read is an error."),
        FacadeKey("log_level", "logging", "INFO", "Level of the rank-aware logger.", LOG_LEVELS),
        FacadeKey(
            "metric_writers",
            "logging",
            ["console"],
            "Where the last rank writes metrics.",
            METRIC_WRITER_KINDS,
        ),
        FacadeKey("metrics_jsonl_path", "logging", None, "File for the 'jsonl' metric writer."),
        FacadeKey("tensorboard_dir", "logging", None, "Folder of the 'tensorboard' writer."),
        FacadeKey("wandb_project", "logging", None, "Project of the 'wandb' writer."),
        FacadeKey("wandb_exp_name", "logging", None, "Run name of the 'wandb' writer."),
        FacadeKey("wandb_save_dir", "logging", None, "Where the 'wandb' writer keeps its files."),
        FacadeKey("wandb_mode", "logging", "auto", "auto: offline if no API key.", WANDB_MODES),
        FacadeKey("wandb_entity", "logging", None,
                  "Entity (team) of the 'wandb' writer, passed as WANDB_ENTITY."),
        FacadeKey("memory_metrics", "logging", False,
                  "Add memory use (GiB) to train()'s metrics."),
        FacadeKey("progress_bar", "logging", True, "Print a progress line on rank 0."),
        FacadeKey("capture_print", "logging", False, "Route print() through the logger."),
        FacadeKey("capture_warnings", "logging", False, "Route warnings through the logger."),
        FacadeKey("device", "wrap", "auto", "auto: cuda if available, else cpu.", DEVICES),
        FacadeKey("batch_source", "wrap", "all_ranks",
                  "Where train()/evaluate() batches are given: on every rank, or on rank 0 only "
                  "(broadcast to the others).", BATCH_SOURCES),
    )
}
"""Every facade-only key, by name."""

FACADE_SECTIONS = tuple(sorted({key.section for key in FACADE_KEYS.values()}))


def facade_defaults() -> dict[str, Any]:
    """Returns a fresh dict of every facade-only key and its default."""
    return {name: copy.deepcopy(key.default) for name, key in FACADE_KEYS.items()}


def check_facade_value(name: str, value: Any, source: str) -> None:
    """Checks a facade-only value against the type of its default and its choices.

    Raises:
        ConfigError: The value has the wrong kind (bool, list, mapping) or is not a choice.
    """
    spec = FACADE_KEYS[name]
    if value is None:
        return
    for kind in (bool, list, dict):
        if isinstance(spec.default, kind) and not isinstance(value, kind):
            raise ConfigError(
                f"'{name}' (from {source}) must be a {kind.__name__}, got {value!r}"
            )
    choices = spec.choices
    if choices is None:
        return
    for item in value if isinstance(value, list) else [value]:
        if item not in choices:
            raise ConfigError(
                f"invalid value {item!r} for '{name}' (from {source}); "
                f"choose from {', '.join(choices)}{did_you_mean(str(item), choices)}"
            )


def known_keys_of(actions: list[argparse.Action]) -> dict[str, Any]:
    """Returns `{dest: default}` for every optional argument among `actions` (not help).

    When several flags share a dest (e.g. `--foo` and `--no-foo`), the first one's default wins,
    as in argparse itself.
    """
    known: dict[str, Any] = {}
    for action in actions:
        if action.option_strings and action.default is not argparse.SUPPRESS:
            known.setdefault(action.dest, action.default)
    return known


def known_keys_from_parser(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """Returns `{dest: default}` of any argparse parser (a test's stand-in, a user's own)."""
    return known_keys_of(parser._actions)  # argparse has no public accessor for its actions


def default_known_keys() -> Mapping[str, Any]:
    """Returns the CLI keys of the training layer's parser (`megatron.varlen_training.arguments`),
    from its public record of its flags."""
    from megatron.varlen_training.arguments import build_parser  # the parser is owned by training/

    return known_keys_of(build_parser().flag_actions)
