"""Reading config YAML: a strict SafeLoader (duplicate keys are errors, `1e-4` is a float)."""

import re
from pathlib import Path
from typing import Any

import yaml

from megatron.wrap.config.errors import ConfigError

_EXPONENT_FLOAT = re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
"""Floats such as `1e-4` and `3E5`, which YAML 1.1 (PyYAML) would otherwise read as strings."""

_EXPONENT_FLOAT_FIRST_CHARS = list("-+0123456789")


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys with different values (PyYAML would keep the last
    silently; a repeat of the same value, as in megatron-wrap's own nest, is harmless) and reads
    exponent-only numbers as floats."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            value = self.construct_object(value_node, deep=True)
            if key in seen and seen[key] != value:
                mark = key_node.start_mark
                raise ConfigError(f"duplicate key '{key}' in {mark.name}, line {mark.line + 1}, "
                                  f"with another value ({seen[key]!r}, then {value!r})")
            seen[key] = value
        return super().construct_mapping(node, deep=deep)


_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", _EXPONENT_FLOAT, _EXPONENT_FLOAT_FIRST_CHARS
)


def load_yaml_file(path: Path, display_name: str) -> dict[str, Any]:
    """Reads a config file that must hold a mapping (an empty file is an empty mapping).

    Args:
        path: The file to read.
        display_name: How errors name the file.

    Raises:
        ConfigError: The file is not valid YAML, has duplicate keys, or is not a mapping.
    """
    with open(path, encoding="utf-8") as stream:
        loader = _StrictLoader(stream)
        loader.name = display_name  # YAML error marks name the file as the user knows it
        try:
            data = loader.get_single_data()
        except yaml.YAMLError as error:
            detail = " ".join(str(error).split())
            raise ConfigError(f"invalid YAML in {display_name}: {detail}") from None
        finally:
            loader.dispose()
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{display_name} must hold a mapping, not {type(data).__name__}")
    return data


def parse_scalar(text: str) -> Any:
    """Parses the value of a `key=value` override as YAML: `64` -> 64, `1e-4` -> 1e-4,
    `true` -> True, `[1, 2]` -> [1, 2], `` -> None, anything else -> the string."""
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError:
        return text


def dump_yaml(data: dict[str, Any]) -> str:
    """Returns `data` as block-style YAML, keys in insertion order."""
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
