"""megatron-wrap's config trees: a *view* file resolved against a *nest* folder (confignest).

megatron-wrap (github.com/0-1CxH/megatron-wrap) keeps every setting in a folder tree, the
nest (`<config dir>/nest/`), and a run's config file is a view of it with the same shape:

- a folder is a mapping; by default *all* its files and subfolders are loaded, each file under
  its name without `.yaml` (`train/common.yaml` -> `train.common`);
- a folder whose `__confignest_manifest__` says `selection_mode: one` (or whose view mapping
  holds `__select__: name`) loads only the chosen file or subfolder, and its keys become the
  folder's own (`arch: {__select__: llama2-7b}` -> `arch.num_layers`); without a choice the
  manifest's `if_no_selection` decides: `error`, `skip` or `default` (`default_selection`);
- in the view, `file: {key: value}` replaces keys of that file; `__override__: {...}` in a
  folder's view replaces keys of every file loaded there; a file's `__inherit__: other.yaml`
  (same folder) is its base.

Differences from confignest, each to turn a silent surprise into a one-line error: a view key
that names no file or folder is an error with the closest name (confignest drops it), and keys
beside `__select__` replace keys of the chosen file (confignest drops them too).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from megatron.wrap.config.errors import ConfigError, did_you_mean
from megatron.wrap.config.tree import (
    CONFIG_SUFFIX,
    OVERRIDE_KEY,
    SELECT_KEY,
    Tree,
    TreeResolver,
    expand_dotted,
    merge_trees,
    tag,
)
from megatron.wrap.config.yaml_io import load_yaml_file

MANIFEST_FILENAME = "__confignest_manifest__"
NEST_FOLDER = "nest"
"""megatron-wrap looks for the nest beside the view file: `<config dir>/nest`."""
SECTIONS = ("megatron_lm", "megatron_wrap")
"""The two top-level keys of a megatron-wrap view: Megatron-LM's flags and the wrapper's."""


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A nest folder's `__confignest_manifest__` (all fields optional in the file).

    Attributes:
        selection_mode: `all` (load every entry) or `one` (load the chosen entry).
        if_no_selection: With `one` and no `__select__`: `error`, `skip` or `default`.
        default_selection: The entry `default` loads.
    """

    selection_mode: str = "all"
    if_no_selection: str = "error"
    default_selection: str | None = None


def is_nest_view(raw: Mapping) -> bool:
    """Whether a config's top level is a megatron-wrap view (`megatron_lm` / `megatron_wrap`)."""
    return any(section in raw for section in SECTIONS)


def nest_root_of(view_file: Path | None, roots: list[Path], explicit_root: bool) -> Path:
    """The nest a view resolves against: an explicit configs root, else `<view dir>/nest`.

    Raises:
        ConfigError: Neither exists.
    """
    if explicit_root or view_file is None:
        return roots[0]
    beside = view_file.parent / NEST_FOLDER
    if beside.is_dir():
        return beside
    raise ConfigError(f"megatron-wrap config {view_file} has no nest folder {beside}; put the "
                      f"nest there or pass configs_root=<the nest folder>")


class NestResolver:
    """Resolves a megatron-wrap view against its nest (module docstring).

    Args:
        nest_root: The nest folder.
    """

    def __init__(self, nest_root: Path):
        self._root = Path(nest_root).resolve()
        self._files = TreeResolver([self._root])

    def resolve_view(self, view: Mapping, source: str) -> Tree:
        """The resolved tree `{megatron_lm: {...}, megatron_wrap: {...}}` of a view.

        Raises:
            ConfigError: A missing folder, choice or file, or a view key naming nothing.
        """
        unknown = [key for key in view if key not in SECTIONS]
        if unknown:
            raise ConfigError(f"unknown top-level key '{unknown[0]}' in megatron-wrap config "
                              f"{source}; it holds {' and '.join(SECTIONS)}"
                              f"{did_you_mean(unknown[0], SECTIONS)}")
        tree: Tree = {}
        for section in SECTIONS:
            folder = self._root / section
            if not folder.is_dir():
                raise ConfigError(f"nest {self._root} has no folder '{section}' (needed by "
                                  f"{source})")
            tree[section] = self._folder(view.get(section), folder, source)
        return tree

    def _folder(self, view: Any, folder: Path, source: str) -> Tree | None:
        view = self._view_mapping(view, folder, source)
        entries = _entries(folder)
        chosen = self._choice(view, folder, entries, source)
        if chosen is _SKIP:
            return None
        names = sorted(entries) if chosen is None else [chosen]
        self._check_view_keys(view, folder, entries, source, one=chosen is not None)
        tree: Tree = {}
        for name in names:
            node = self._entry(entries[name], view, name, source)
            if node is None:
                continue
            if chosen is None:
                tree[name] = node
            else:  # the chosen entry's keys are the folder's own
                merge_trees(tree, node)
        if chosen is not None:
            extra = {k: v for k, v in view.items() if k not in (SELECT_KEY, OVERRIDE_KEY, chosen)}
            merge_trees(tree, tag(extra, source))
        return tree

    def _entry(self, path: Path, view: Mapping, name: str, source: str) -> Tree | None:
        if path.is_dir():
            return self._folder(view.get(name), path, source)
        node = self._files.resolve_file(path)  # its __inherit__ is relative to its folder
        if view.get(OVERRIDE_KEY) is not None:
            where = f"{source} ({OVERRIDE_KEY})"
            merge_trees(node, tag(expand_dotted(view[OVERRIDE_KEY], where), where))
        inline = view.get(name)
        if isinstance(inline, Mapping):
            merge_trees(node, tag(inline, source))
        elif inline is not None:
            raise ConfigError(f"config key '{self._display(path)}' (from {source}) names a file "
                              f"of the nest: give it a mapping of keys, got {inline!r}")
        return node

    def _choice(self, view: Mapping, folder: Path, entries: dict[str, Path], source: str):
        manifest = _manifest(folder)
        choice = view.get(SELECT_KEY)
        if choice is None and manifest.selection_mode != "one":
            return None
        if choice is None:
            if manifest.if_no_selection == "skip":
                return _SKIP
            choice = manifest.default_selection if manifest.if_no_selection == "default" \
                else None
        if choice is None:
            raise ConfigError(f"nest folder '{self._display(folder)}' (from {source}) needs a "
                              f"choice: {{{SELECT_KEY}: <one of {', '.join(sorted(entries))}>}}")
        stem = str(choice).removesuffix(CONFIG_SUFFIX)
        if stem not in entries:
            raise ConfigError(f"{SELECT_KEY} '{choice}' (from {source}) is not in nest folder "
                              f"'{self._display(folder)}'; choices: {', '.join(sorted(entries))}"
                              f"{did_you_mean(stem, entries)}")
        return stem

    def _check_view_keys(self, view: Mapping, folder: Path, entries: dict[str, Path],
                         source: str, one: bool) -> None:
        if one:
            return  # keys beside __select__ replace keys of the chosen entry
        for key in view:
            if key not in (SELECT_KEY, OVERRIDE_KEY) and key not in entries:
                raise ConfigError(
                    f"config key '{key}' (from {source}) names no file or folder of nest folder "
                    f"'{self._display(folder)}' ({', '.join(sorted(entries))})"
                    f"{did_you_mean(key, entries)}")

    def _view_mapping(self, view: Any, folder: Path, source: str) -> Mapping:
        if view is None:
            return {}
        if not isinstance(view, Mapping):
            raise ConfigError(f"config key '{self._display(folder)}' (from {source}) names a "
                              f"nest folder: give it a mapping, got {view!r}")
        return view

    def _display(self, path: Path) -> str:
        return str(path.relative_to(self._root).with_suffix(""))


_SKIP = object()
"""`_choice`'s answer for a folder whose manifest says to skip it when nothing is chosen."""


def _entries(folder: Path) -> dict[str, Path]:
    """`{name: path}` of a nest folder: files without `.yaml`, subfolders by name."""
    entries: dict[str, Path] = {}
    for path in sorted(folder.iterdir()):
        if path.name == MANIFEST_FILENAME or path.name.startswith("."):
            continue
        if path.is_file() and path.suffix != CONFIG_SUFFIX:
            continue
        name = path.stem if path.is_file() else path.name
        if name in entries:
            raise ConfigError(f"nest folder {folder} holds both {name}{CONFIG_SUFFIX} and a "
                              f"folder {name}; rename one")
        entries[name] = path
    return entries


def _manifest(folder: Path) -> Manifest:
    path = folder / MANIFEST_FILENAME
    if not path.is_file():
        return Manifest()
    raw = load_yaml_file(path, str(path)) or {}
    fields = {f.name for f in dataclasses.fields(Manifest)}
    unknown = sorted(set(raw) - fields)
    if unknown:
        raise ConfigError(f"unknown key '{unknown[0]}' in {path}; known: "
                          f"{', '.join(sorted(fields))}")
    return Manifest(**raw)
