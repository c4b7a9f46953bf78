"""The config tree of `megatron.wrap`: YAML files with `__select__`/`__inherit__`/`__override__`,
flattened onto pretrain_gpt.py's argument names. See docs/WRAP_CONFIG.md."""

from megatron.wrap.config.argv import flat_config_to_argv
from megatron.wrap.config.build import (
    DEFAULT_CONFIGS_ROOT,
    WrapConfig,
    build_config,
    config_path,
)
from megatron.wrap.config.errors import ConfigError
from megatron.wrap.config.keys import (
    FACADE_KEYS,
    SECTIONS,
    FacadeKey,
    facade_defaults,
    known_keys_from_parser,
)

__all__ = [
    "DEFAULT_CONFIGS_ROOT",
    "FACADE_KEYS",
    "SECTIONS",
    "ConfigError",
    "FacadeKey",
    "WrapConfig",
    "build_config",
    "config_path",
    "facade_defaults",
    "flat_config_to_argv",
    "known_keys_from_parser",
]
