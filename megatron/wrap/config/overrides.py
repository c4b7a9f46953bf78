"""Overrides given from Python or the command line: `["model.hidden_size=64", ...]` or a dict.

They are applied to the resolved tree, after every file, so they win over everything. A bare
key (`lr=1e-3`) goes to the one section that already holds it (facade keys: to their section);
a section name with a mapping (`{"model": {"num_layers": 4}}`) merges into that section.
"""

from collections.abc import Mapping, Sequence
from typing import Any

from megatron.wrap.config.errors import ConfigError
from megatron.wrap.config.keys import FACADE_KEYS, SECTIONS
from megatron.wrap.config.tree import Tree, merge_trees, tag
from megatron.wrap.config.yaml_io import parse_scalar

Overrides = Sequence[str] | Mapping[str, Any] | None
"""`["section.key=value", ...]` (values parsed as YAML) or `{"section.key": value}`."""


def apply_overrides(tree: Tree, overrides: Overrides, nested: bool = False) -> None:
    """Applies overrides to a resolved tree in place, in order (later ones win).

    Args:
        tree: The resolved config.
        overrides: See `Overrides`.
        nested: Keys sit at any depth (a megatron-wrap view): a bare key goes to the one
            mapping, however deep, that holds it (`num_layers=2` ->
            `megatron_lm.model.arch.num_layers`).

    Raises:
        ConfigError: A malformed override, or a bare key that no single section holds.
    """
    for parts, value, label in _parse(overrides):
        if len(parts) == 1 and nested:
            parts = [*_home_path(tree, parts[0], label), parts[0]]
        elif len(parts) == 1 and parts[0] not in SECTIONS:
            parts = [_home_section(tree, parts[0], label), parts[0]]
        node = tag(value, label)
        for part in reversed(parts[1:]):
            node = {part: node}
        merge_trees(tree, {parts[0]: node})


def _parse(overrides: Overrides) -> list[tuple[list[str], Any, str]]:
    """Returns (key path, value, label for errors) for each override."""
    if overrides is None:
        return []
    if isinstance(overrides, Mapping):
        items = [(str(key), value, f"override '{key}'") for key, value in overrides.items()]
    elif isinstance(overrides, str):
        raise ConfigError(f"overrides must be a list of 'key=value' strings, got {overrides!r}")
    else:
        items = [_split(text) for text in overrides]
    parsed = []
    for key, value, label in items:
        parts = key.split(".")
        if not all(parts):
            raise ConfigError(f"malformed key in {label}")
        parsed.append((parts, value, label))
    return parsed


def _split(text: str) -> tuple[str, Any, str]:
    key, sep, value = str(text).partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override '{text}' must look like 'section.key=value'")
    return key.strip(), parse_scalar(value.strip()), f"override '{text}'"


def _home_section(tree: Tree, key: str, label: str) -> str:
    """Returns the section a bare override key belongs to."""
    holders = [name for name, body in tree.items() if isinstance(body, dict) and key in body]
    if len(holders) == 1:
        return holders[0]
    if not holders and key in FACADE_KEYS:
        return FACADE_KEYS[key].section
    where = f"sections {', '.join(holders)} all hold it" if holders else "no section holds it"
    raise ConfigError(
        f"{label} names no section and {where}; write it as '<section>.{key}=...'"
    )


def _home_path(tree: Tree, key: str, label: str) -> list[str]:
    """The path of the one mapping, at any depth, that holds ``key``."""
    holders = list(_paths_holding(tree, key, []))
    if len(holders) == 1:
        return holders[0]
    where = f"{', '.join('.'.join(path) for path in holders)} all hold it" if holders \
        else "nothing holds it"
    raise ConfigError(f"{label} names no place and {where}; write the full path "
                      f"('<path>.{key}=...')")


def _paths_holding(node: Tree, key: str, path: list[str]):
    if key in node and not isinstance(node[key], dict):
        yield path
    for name, child in node.items():
        if isinstance(child, dict):
            yield from _paths_holding(child, key, [*path, name])
