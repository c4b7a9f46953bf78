"""Resolving a config tree: `__inherit__`, `__select__`, inline keys and `__override__`.

Within one mapping the parts are applied in this order, later ones winning:

1. `__inherit__: parent.yaml` (or a list, later parents winning): each parent file, fully
   resolved, is the base. Paths are relative to the file that names them.
2. `__select__: {folder: choice}`: `<configs root>/<folder>/<choice>.yaml`, fully resolved,
   becomes the value of key `<folder>`; it *replaces* whatever the parents put there.
   `__select__: choice` (megatron-wrap's form) inside the mapping of key path `a.b` picks
   `<configs root>/a/b/<choice>.yaml` as the base of that mapping itself.
3. Inline keys: mappings deep-merge into what 1-2 produced, other values replace.
4. `__override__: {...}`: deep-merged last; its keys may be dotted (`model.num_layers: 4`).

A mapping is resolved completely (its own four steps) before the enclosing mapping merges it,
so an enclosing file's `__override__` beats anything inside. Leaves remember their file.
"""

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from megatron.wrap.config.errors import ConfigError, did_you_mean
from megatron.wrap.config.yaml_io import load_yaml_file

INHERIT_KEY = "__inherit__"
SELECT_KEY = "__select__"
OVERRIDE_KEY = "__override__"
DIRECTIVES = (INHERIT_KEY, SELECT_KEY, OVERRIDE_KEY)
CONFIG_SUFFIX = ".yaml"


@dataclasses.dataclass(frozen=True)
class Leaf:
    """A resolved non-mapping value and where it was set.

    Attributes:
        value: The value (scalar, list or None).
        source: The file (or override) that set it, for error messages.
    """

    value: Any
    source: str


Tree = dict[str, Any]
"""A resolved config: nested dicts whose non-mapping values are `Leaf`s."""


def merge_trees(base: dict, update: Mapping) -> dict:
    """Deep-merges `update` into `base` in place: mappings recurse, anything else replaces.

    Returns:
        `base`, for chaining.
    """
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            merge_trees(base[key], value)
        else:
            base[key] = value
    return base


def expand_dotted(mapping: Mapping, where: str) -> dict:
    """Turns `{"model.num_layers": 4}` into `{"model": {"num_layers": 4}}`.

    Args:
        mapping: Keys may contain dots; the parts must be non-empty.
        where: Names the mapping in errors.
    """
    expanded: dict = {}
    for key, value in mapping.items():
        parts = str(key).split(".")
        if not all(parts):
            raise ConfigError(f"malformed dotted key '{key}' in {where}")
        for part in reversed(parts[1:]):
            value = {part: value}
        merge_trees(expanded, {parts[0]: value})
    return expanded


def untag(node: Any) -> Any:
    """Returns the plain value of a resolved node (dicts of values instead of `Leaf`s)."""
    if isinstance(node, Leaf):
        return node.value
    return {key: untag(child) for key, child in node.items()}


def first_source(node: Any) -> str:
    """Returns the source of a `Leaf`, or of the first leaf inside a mapping."""
    if isinstance(node, Leaf):
        return node.source
    for child in node.values():
        return first_source(child)
    return "<empty mapping>"


def tag(value: Any, source: str) -> Any:
    """Wraps a plain value as a resolved node (no directives are interpreted)."""
    if isinstance(value, Mapping):
        return {str(key): tag(child, source) for key, child in value.items()}
    return Leaf(value, source)


class TreeResolver:
    """Resolves config files and mappings against one or more configs roots.

    Args:
        roots: Folders searched in order for `__select__` choices.
    """

    def __init__(self, roots: Sequence[Path]):
        self._roots = [Path(root).resolve() for root in roots]
        self._stack: list[Path] = []

    def display(self, path: Path) -> str:
        """Returns `path` relative to the configs root holding it, else absolute."""
        for root in self._roots:
            if path.is_relative_to(root):
                return str(path.relative_to(root))
        return str(path)

    def resolve_file(self, path: Path) -> Tree:
        """Loads and resolves one config file.

        Raises:
            ConfigError: On a cycle of `__inherit__`/`__select__`, naming the chain.
        """
        path = Path(path).resolve()
        if path in self._stack:
            loop = [*self._stack[self._stack.index(path) :], path]
            chain = " -> ".join(self.display(p) for p in loop)
            raise ConfigError(f"config cycle: {chain}")
        name = self.display(path)
        raw = load_yaml_file(path, name)
        self._stack.append(path)
        try:
            return self.resolve_mapping(raw, name, path.parent)
        finally:
            self._stack.pop()

    def resolve_mapping(self, raw: Mapping, source: str, base_dir: Path,
                        key_path: tuple[str, ...] = ()) -> Tree:
        """Resolves one mapping: inherit, select, inline keys, override (see module doc).

        Args:
            raw: The mapping as read from YAML or given in Python.
            source: Names its file in errors and in `Leaf.source`.
            base_dir: Folder that relative `__inherit__` paths start from.
            key_path: The keys leading to this mapping in its file (`("model",)`); the folder
                a string `__select__` picks from.
        """
        _check_keys(raw, source)
        tree: Tree = {}
        for parent in _as_path_list(raw.get(INHERIT_KEY), source):
            merge_trees(tree, self.resolve_file(self._inherit_path(parent, base_dir, source)))
        if isinstance(raw.get(SELECT_KEY), str):
            folder = self._own_folder(key_path, raw[SELECT_KEY], source)
            tree = self.resolve_file(self._select_path(folder, raw[SELECT_KEY], source))
        for folder, choice in _select_items(raw.get(SELECT_KEY), source):
            tree[folder] = self.resolve_file(self._select_path(folder, choice, source))
        for key, value in raw.items():
            if key not in DIRECTIVES:
                resolved = self._resolve_value(value, source, base_dir, (*key_path, key))
                merge_trees(tree, {key: resolved})
        if raw.get(OVERRIDE_KEY) is not None:
            override = _as_mapping(raw[OVERRIDE_KEY], OVERRIDE_KEY, source)
            where = f"{source} ({OVERRIDE_KEY})"
            merge_trees(tree, self.resolve_mapping(expand_dotted(override, where), where,
                                                   base_dir, key_path))
        return tree

    def _resolve_value(self, value: Any, source: str, base_dir: Path,
                       key_path: tuple[str, ...]) -> Any:
        if isinstance(value, Mapping):
            return self.resolve_mapping(value, source, base_dir, key_path)
        return Leaf(value, source)

    @staticmethod
    def _own_folder(key_path: tuple[str, ...], choice: str, source: str) -> str:
        """The folder a string `__select__` picks from: the path of keys leading to it."""
        if not key_path:
            raise ConfigError(
                f"{SELECT_KEY} in {source} must map folder to choice ({SELECT_KEY}: "
                f"{{model: {choice}}}) or sit inside the folder's key (model: {{{SELECT_KEY}: "
                f"{choice}}}); at the top it names no folder"
            )
        return "/".join(key_path)

    def _inherit_path(self, parent: str, base_dir: Path, source: str) -> Path:
        path = base_dir / parent
        if not path.is_file():
            raise ConfigError(f"{INHERIT_KEY} file '{parent}' (from {source}) not found: {path}")
        return path

    def _select_path(self, folder: str, choice: Any, source: str) -> Path:
        folders = [root / folder for root in self._roots if (root / folder).is_dir()]
        if not folders:
            known = self.folders()
            raise ConfigError(
                f"{SELECT_KEY} folder '{folder}' (from {source}) not found under "
                f"{', '.join(map(str, self._roots))}; folders: {', '.join(known)}"
                f"{did_you_mean(folder, known)}"
            )
        choices = _list_choices(folders)
        if not isinstance(choice, str) or not choice:
            raise ConfigError(
                f"{SELECT_KEY} of folder '{folder}' (from {source}) needs a file name; "
                f"choices: {', '.join(choices)}"
            )
        stem = choice.removesuffix(CONFIG_SUFFIX)
        for candidate in folders:
            if (candidate / f"{stem}{CONFIG_SUFFIX}").is_file():
                return candidate / f"{stem}{CONFIG_SUFFIX}"
        raise ConfigError(
            f"{SELECT_KEY} '{choice}' (from {source}) is not in folder '{folder}'; "
            f"choices: {', '.join(choices)}{did_you_mean(stem, choices)}"
        )

    def folders(self) -> list[str]:
        """Returns the folder names that `__select__` can pick from, sorted."""
        roots = [root for root in self._roots if root.is_dir()]
        return sorted({p.name for root in roots for p in root.iterdir() if p.is_dir()})


def _list_choices(folders: list[Path]) -> list[str]:
    """Returns the selectable names (paths without suffix) found in `folders`, sorted."""
    files = [(folder, p) for folder in folders for p in folder.rglob(f"*{CONFIG_SUFFIX}")]
    return sorted({str(p.relative_to(folder).with_suffix("")) for folder, p in files})


def _check_keys(raw: Mapping, source: str) -> None:
    for key in raw:
        if not isinstance(key, str):
            raise ConfigError(f"config keys must be strings, got {key!r} in {source}")
        if key.startswith("__") and key.endswith("__") and key not in DIRECTIVES:
            hint = did_you_mean(key, DIRECTIVES)
            raise ConfigError(f"unknown directive '{key}' in {source}{hint}")


def _as_path_list(value: Any, source: str) -> list[str]:
    if value is None:
        return []
    paths = [value] if isinstance(value, str) else value
    if not isinstance(paths, list) or not all(isinstance(p, str) and p for p in paths):
        raise ConfigError(
            f"{INHERIT_KEY} in {source} must be a path or a list of paths, got {value!r}"
        )
    return paths


def _as_mapping(value: Any, directive: str, source: str) -> Mapping:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{directive} in {source} must be a mapping, got {type(value).__name__}")
    return value


def _select_items(value: Any, source: str) -> list[tuple[str, Any]]:
    if value is None or isinstance(value, str):  # a string picks the mapping's own folder
        return []
    example = "e.g. {model: tiny_gpt}"
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{SELECT_KEY} in {source} must map folder to choice ({example}), got {value!r}"
        )
    return [(str(folder), choice) for folder, choice in value.items()]
