"""`build_config`: a YAML tree (or dict) plus overrides -> a validated, flat `WrapConfig`.

Runs in a plain Python process: no torch.distributed, no torchrun.
"""

import argparse
import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from megatron.wrap.config.argv import flat_config_to_argv
from megatron.wrap.config.errors import ConfigError, did_you_mean
from megatron.wrap.config.flatten import flatten_tree
from megatron.wrap.config.keys import default_known_keys, known_keys_from_parser
from megatron.wrap.config.nest import NestResolver, is_nest_view, nest_root_of
from megatron.wrap.config.nest_keys import native_tree
from megatron.wrap.config.overrides import Overrides, apply_overrides
from megatron.wrap.config.tree import CONFIG_SUFFIX, TreeResolver, untag
from megatron.wrap.config.yaml_io import dump_yaml, load_yaml_file

DEFAULT_CONFIGS_ROOT = Path(__file__).resolve().parent.parent / "configs"
"""The shipped library (`megatron/wrap/configs`)."""

DICT_SOURCE = "<dict>"
"""How errors name a config given as a Python mapping."""

PathLike = str | Path
KnownKeys = Mapping[str, Any] | argparse.ArgumentParser | None
"""CLI keys as `{dest: default}`, or a parser to read them from; None: the training parser."""


@dataclasses.dataclass(frozen=True)
class WrapConfig:
    """A resolved and validated config.

    Attributes:
        flat: pretrain_gpt.py argument (argparse dest) -> value; None means "parser default".
        facade: Facade-only key -> value, every key present (defaults filled in).
        sources: Key of `flat` or `facade` -> the file or override that set it.
        tree: The resolved nested config as plain data (what `to_yaml` writes); for a
            megatron-wrap config its native form (the kept keys, sections `megatron`, `flow`,
            `logging`), which builds again without the nest.
        ignored: Keys of a megatron-wrap config that change nothing here -> why (nest_keys.py).
    """

    flat: dict[str, Any]
    facade: dict[str, Any]
    sources: dict[str, str]
    tree: dict[str, Any]
    ignored: dict[str, str] = dataclasses.field(default_factory=dict)

    def to_argv(self, parser: argparse.ArgumentParser) -> list[str]:
        """Returns `flat` as command-line flags for `parser` (see `flat_config_to_argv`)."""
        return flat_config_to_argv(self.flat, parser)

    def to_yaml(self) -> str:
        """Returns the resolved tree as YAML: a self-contained copy of the run's config."""
        return dump_yaml(self.tree)


def build_config(
    source: PathLike | Mapping[str, Any],
    overrides: Overrides = None,
    configs_root: PathLike | Sequence[PathLike] | None = None,
    known_keys: KnownKeys = None,
) -> WrapConfig:
    """Resolves a config tree, applies overrides, flattens and validates the keys.

    Args:
        source: A YAML file, or a mapping (its relative `__inherit__` paths start at the first
            configs root).
        overrides: `["section.key=value", ...]` or `{"section.key": value}`; they win over all.
        configs_root: Folder(s) searched in order for `__select__`; default the shipped library.
        known_keys: The valid CLI keys (see `KnownKeys`).

    Raises:
        ConfigError: Any user error in the tree, the overrides or the keys (one line).
    """
    _check_source(source)
    roots = _as_roots(configs_root)
    view = _megatron_wrap_view(source, TreeResolver(roots))
    if view is not None:
        return _build_from_view(view, source, overrides, roots, configs_root is not None,
                                _known_keys(known_keys))
    resolver = TreeResolver(roots)
    if isinstance(source, Mapping):
        tree = resolver.resolve_mapping(source, DICT_SOURCE, roots[0])
    else:
        tree = resolver.resolve_file(_existing_file(Path(source)))
    apply_overrides(tree, overrides)
    flat = flatten_tree(tree, _known_keys(known_keys))
    return WrapConfig(flat=flat.flat, facade=flat.facade, sources=flat.sources, tree=untag(tree))


def _check_source(source) -> None:
    if not isinstance(source, (str, os.PathLike, Mapping)):
        raise ConfigError(f"a config is a YAML file path or a mapping of sections, got "
                          f"{type(source).__name__} {source!r:.60}")


def _megatron_wrap_view(source: PathLike | Mapping[str, Any],
                        resolver: TreeResolver) -> Mapping | None:
    """The raw view if `source` is a megatron-wrap config (config/nest.py), else None."""
    if isinstance(source, Mapping):
        return source if is_nest_view(source) else None
    path = _existing_file(Path(source)).resolve()
    raw = load_yaml_file(path, resolver.display(path))
    return raw if isinstance(raw, Mapping) and is_nest_view(raw) else None


def _build_from_view(view: Mapping, source: PathLike | Mapping, overrides: Overrides,
                     roots: list[Path], explicit_root: bool,
                     known_keys: Mapping[str, Any]) -> WrapConfig:
    """A megatron-wrap config: resolved against its nest, overrides applied to that tree
    (`megatron_lm.model.arch.num_layers=2`), then mapped to this fork's keys."""
    view_file = None if isinstance(source, Mapping) else Path(source).resolve()
    nest = NestResolver(nest_root_of(view_file, roots, explicit_root))
    tree = nest.resolve_view(view, DICT_SOURCE if view_file is None else str(view_file))
    apply_overrides(tree, overrides, nested=True)
    native, ignored = native_tree(tree, known_keys)
    flat = flatten_tree(native, known_keys)
    # The native tree: what to_yaml() stores builds again, without the nest, to the same run.
    return WrapConfig(flat=flat.flat, facade=flat.facade, sources=flat.sources,
                      tree=untag(native), ignored=ignored)


def config_path(name: str, configs_root: PathLike | Sequence[PathLike] | None = None) -> Path:
    """Returns the top-level config `name` (e.g. `sft_tiny_cpu`) of the configs root(s).

    Raises:
        ConfigError: No root holds it; names the available configs.
    """
    roots = _as_roots(configs_root)
    stem = name.removesuffix(CONFIG_SUFFIX)
    for root in roots:
        if (root / f"{stem}{CONFIG_SUFFIX}").is_file():
            return root / f"{stem}{CONFIG_SUFFIX}"
    names = sorted({p.stem for root in roots for p in root.glob(f"*{CONFIG_SUFFIX}")})
    raise ConfigError(
        f"no config '{name}' in {', '.join(map(str, roots))}; "
        f"choices: {', '.join(names)}{did_you_mean(stem, names)}"
    )


def _as_roots(configs_root: PathLike | Sequence[PathLike] | None) -> list[Path]:
    if configs_root is None:
        return [DEFAULT_CONFIGS_ROOT]
    if isinstance(configs_root, (str, Path)):
        return [Path(configs_root)]
    return [Path(root) for root in configs_root]


def _existing_file(path: Path) -> Path:
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    return path


def _known_keys(known_keys: KnownKeys) -> Mapping[str, Any]:
    if known_keys is None:
        return default_known_keys()
    if isinstance(known_keys, argparse.ArgumentParser):
        return known_keys_from_parser(known_keys)
    return known_keys
