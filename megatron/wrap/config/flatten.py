"""Flattening a resolved tree into CLI keys and facade-only keys, rejecting unknown keys."""

import dataclasses
from collections.abc import Mapping
from typing import Any

from megatron.wrap.config.errors import ConfigError, did_you_mean, hybrid_model_hint
from megatron.wrap.config.keys import (
    FACADE_KEYS,
    SECTIONS,
    check_facade_value,
    facade_defaults,
)
from megatron.wrap.config.tree import Leaf, Tree, first_source, untag


@dataclasses.dataclass
class FlatConfig:
    """The flat view of a config.

    Attributes:
        flat: CLI key -> value, in config order (None means "leave the parser default").
        facade: Every facade-only key -> value (defaults filled in).
        sources: Key -> the file or override that set it.
        sections: CLI key -> the section it sits in.
    """

    flat: dict[str, Any] = dataclasses.field(default_factory=dict)
    facade: dict[str, Any] = dataclasses.field(default_factory=facade_defaults)
    sources: dict[str, str] = dataclasses.field(default_factory=dict)
    sections: dict[str, str] = dataclasses.field(default_factory=dict)


def flatten_tree(tree: Tree, known_keys: Mapping[str, Any]) -> FlatConfig:
    """Maps every leaf `section.key` of a resolved tree to `key`.

    Args:
        tree: A resolved config (see `tree.TreeResolver`).
        known_keys: The CLI keys (argparse dests) of pretrain_gpt.py's parser.

    Raises:
        ConfigError: Unknown section or key (with the closest valid one), a key set in two
            sections, a facade key outside its section, or an invalid facade value.
    """
    result = FlatConfig()
    unknown: list[str] = []
    for section, body in tree.items():
        for key, node in _section_items(section, body, known_keys):
            if key in FACADE_KEYS:
                _place_facade_key(result, section, key, node)
            elif key in known_keys:
                _place_cli_key(result, section, key, node)
            else:
                unknown.append(_unknown_key(section, key, node, known_keys))
    if len(unknown) == 1:
        raise ConfigError(unknown[0])
    if unknown:  # all at once, so a config is fixed in one pass
        raise ConfigError(f"{len(unknown)} unknown config keys: {' | '.join(unknown)}")
    return result


def _section_items(section: str, body: Any, known_keys: Mapping[str, Any]) -> list[tuple]:
    """Returns the (key, node) pairs of a top-level section after checking it is one."""
    if section not in SECTIONS:
        source = first_source(body)
        if isinstance(body, Leaf) and (section in known_keys or section in FACADE_KEYS):
            raise ConfigError(
                f"config key '{section}' (from {source}) must sit in a section: "
                f"one of {', '.join(SECTIONS)}"
            )
        hint = did_you_mean(section, SECTIONS)
        raise ConfigError(f"unknown config section '{section}' (from {source}){hint}")
    if isinstance(body, Leaf):
        if body.value is None:  # `model:` with nothing under it
            return []
        raise ConfigError(
            f"section '{section}' (from {body.source}) must be a mapping, got {body.value!r}"
        )
    return list(body.items())


def _place_facade_key(result: FlatConfig, section: str, key: str, node: Any) -> None:
    source = first_source(node)
    home = FACADE_KEYS[key].section
    if section != home:
        raise ConfigError(
            f"facade key '{key}' (from {source}) belongs in section '{home}', not '{section}'"
        )
    value = untag(node)
    check_facade_value(key, value, source)
    result.facade[key] = value
    result.sources[key] = source


def _place_cli_key(result: FlatConfig, section: str, key: str, node: Any) -> None:
    source = first_source(node)
    if key in result.sections:
        first = result.sections[key]
        raise ConfigError(
            f"config key '{key}' is set in section '{first}' (from {result.sources[key]}) "
            f"and in section '{section}' (from {source}); keep one"
        )
    result.flat[key] = untag(node)
    result.sources[key] = source
    result.sections[key] = section


def _unknown_key(section: str, key: str, node: Any, known_keys: Mapping) -> str:
    """The message for one unknown key, with the closest valid name."""
    local_facade = [name for name, spec in FACADE_KEYS.items() if spec.section == section]
    hint = hybrid_model_hint(key) or did_you_mean(key, [*known_keys, *local_facade])
    if not hint:
        hint = "; it is neither a pretrain_gpt.py argument nor a facade key of this section"
    return f"unknown config key '{section}.{key}' (from {first_source(node)}){hint}"
