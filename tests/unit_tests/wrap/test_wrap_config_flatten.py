"""Flattening: unknown keys and sections, duplicates, facade-only keys, and the result."""

import pytest
import yaml

from megatron.wrap.config import FACADE_KEYS, ConfigError, build_config, facade_defaults


def build(source, known_keys, overrides=None):
    return build_config(source, overrides=overrides, known_keys=known_keys)


def test_unknown_key_names_key_file_and_closest(write_configs, known_keys):
    root = write_configs({"run.yaml": "model:\n  hidden_sise: 64\n"})
    with pytest.raises(ConfigError) as error:
        build(root / "run.yaml", known_keys)
    message = str(error.value)
    assert message.startswith("unknown config key 'model.hidden_sise'")
    assert f"(from {root / 'run.yaml'})" in message
    assert message.endswith("did you mean 'hidden_size'?")
    assert "\n" not in message


def test_unknown_key_without_a_close_match(known_keys):
    with pytest.raises(ConfigError, match="neither a pretrain_gpt.py argument nor a facade key"):
        build({"model": {"zzzz": 1}}, known_keys)


def test_a_hybrid_model_key_names_pretrain_mamba(known_keys):
    """The facade builds pretrain_gpt.py's GPT: a hybrid-model key is refused saying so, not
    with the closest flag (mamba_state_dim used to suggest 'wandb_save_dir')."""
    for key, value in (("mamba_state_dim", 16), ("hybrid_override_pattern", "M*")):
        with pytest.raises(ConfigError) as error:
            build({"model": {key: value}}, {**known_keys, "wandb_save_dir": None})
        assert str(error.value) == (
            f"unknown config key 'model.{key}' (from <dict>); it is pretrain_mamba.py's "
            f"hybrid-model flag: megatron.wrap trains pretrain_gpt.py's GPT models (dense or "
            f"MoE), train a hybrid Mamba model with pretrain_mamba.py")


def test_unknown_key_from_a_selected_file_names_that_file(write_configs, known_keys):
    root = write_configs({"model/m.yaml": "num_layer: 2\n"})
    expected = r"'model\.num_layer' \(from model/m\.yaml\).*'num_layers'"
    with pytest.raises(ConfigError, match=expected):
        build_config({"__select__": {"model": "m"}}, configs_root=root, known_keys=known_keys)


def test_facade_keys_are_suggested_in_their_section(known_keys):
    with pytest.raises(ConfigError, match="did you mean 'log_level'"):
        build({"logging": {"log_levl": "INFO"}}, known_keys)


def test_unknown_section_names_closest(known_keys):
    with pytest.raises(ConfigError, match="unknown config section 'modle'.*did you mean 'model'"):
        build({"modle": {"num_layers": 2}}, known_keys)


def test_top_level_leaf_must_sit_in_a_section(known_keys):
    with pytest.raises(ConfigError, match="'num_layers' .* must sit in a section: one of model"):
        build({"num_layers": 2}, known_keys)


def test_key_in_two_sections_is_an_error(known_keys):
    source = {"optimizer": {"lr": 0.1}, "training": {"lr": 0.2}}
    expected = "'lr' is set in section 'optimizer' .* and in section 'training' .*keep one"
    with pytest.raises(ConfigError, match=expected):
        build(source, known_keys)


def test_facade_key_outside_its_section_is_an_error(known_keys):
    expected = "'log_level' .* belongs in section 'logging', not 'model'"
    with pytest.raises(ConfigError, match=expected):
        build({"model": {"log_level": "INFO"}}, known_keys)


@pytest.mark.parametrize(
    "logging_section, message",
    [
        ({"log_level": "LOUD"}, "invalid value 'LOUD' for 'log_level'"),
        ({"metric_writers": ["console", "tensorbord"]}, "did you mean 'tensorboard'"),
        ({"metric_writers": "console"}, "'metric_writers' .* must be a list"),
        ({"progress_bar": "yes please"}, "'progress_bar' .* must be a bool"),
    ],
)
def test_facade_values_are_checked(known_keys, logging_section, message):
    with pytest.raises(ConfigError, match=message):
        build({"logging": logging_section}, known_keys)


def test_facade_defaults_are_filled_and_cli_keys_stay_apart(known_keys):
    config = build({"logging": {"log_interval": 5, "log_level": "DEBUG"}, "flow": {}}, known_keys)
    assert config.flat == {"log_interval": 5}
    assert config.facade == {**facade_defaults(), "log_level": "DEBUG"}
    assert set(config.facade) == set(FACADE_KEYS)
    assert not set(FACADE_KEYS) & set(known_keys), "facade keys must not shadow CLI keys"


def test_facade_defaults_are_fresh_copies(known_keys):
    build({}, known_keys).facade["metric_writers"].append("wandb")
    assert build({}, known_keys).facade["metric_writers"] == ["console"]


def test_empty_section_is_allowed_and_scalar_section_is_not(known_keys):
    assert build({"model": None}, known_keys).flat == {}
    with pytest.raises(ConfigError, match="section 'model' .* must be a mapping, got 3"):
        build({"model": 3}, known_keys)


def test_mapping_value_of_a_known_key_is_one_leaf(known_keys):
    mock = {"mode": "distribution", "min_seq_len": 8}
    config = build({"data": {"sft_mock_dataset_config_json": mock}}, known_keys,
                   overrides=["data.sft_mock_dataset_config_json.min_seq_len=16"])
    expected = {"mode": "distribution", "min_seq_len": 16}
    assert config.flat == {"sft_mock_dataset_config_json": expected}


def test_null_values_are_kept_as_none(known_keys):
    assert build({"checkpoint": {"save": None}}, known_keys).flat == {"save": None}


def test_known_keys_may_be_a_parser(library_parser):
    config = build_config({"model": {"num_layers": 2}}, known_keys=library_parser)
    assert config.flat == {"num_layers": 2}


def test_to_yaml_round_trips(known_keys):
    config = build_config({"__select__": {"model": "llama_like", "logging": "wandb_offline"}},
                          known_keys=known_keys, overrides=["model.num_layers=3"])
    again = build(yaml.safe_load(config.to_yaml()), known_keys)
    assert again.flat == config.flat
    assert again.facade == config.facade
