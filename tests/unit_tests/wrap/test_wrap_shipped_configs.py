"""Every shipped config builds against a parser that knows exactly the allowed CLI keys, and its
flags parse back to the same values; a typo in the library fails here."""

import json

import pytest

from megatron.varlen_training.flag_values import parse_values
from megatron.wrap.config import (
    DEFAULT_CONFIGS_ROOT,
    build_config,
    config_path,
    flat_config_to_argv,
    known_keys_from_parser,
)

FOLDER_CONFIGS = sorted(
    (path.parent.name, path.stem) for path in DEFAULT_CONFIGS_ROOT.glob("*/*.yaml")
)
TOP_LEVEL_CONFIGS = sorted(path.stem for path in DEFAULT_CONFIGS_ROOT.glob("*.yaml"))


def test_library_contents_are_pinned():
    assert FOLDER_CONFIGS == [
        ("logging", "console"), ("logging", "tensorboard"), ("logging", "wandb_offline"),
        ("model", "llama_like"), ("model", "tiny_gpt"), ("optimizer", "adam_cosine"),
        ("parallel", "cp2"), ("parallel", "pp2"), ("parallel", "single"), ("parallel", "tp2"),
        ("parallel", "tp2_dp2"),
    ]
    assert TOP_LEVEL_CONFIGS == ["rl_runtime_cpu", "sft_tiny_cpu"]


def assert_parses_back(config, parser):
    namespace = vars(parser.parse_args(config.to_argv(parser)))
    for key, value in config.flat.items():
        if isinstance(value, dict):
            assert json.loads(namespace[key]) == value, key
        elif value is not None:
            assert namespace[key] == value, key


@pytest.mark.parametrize("folder, name", FOLDER_CONFIGS)
def test_every_folder_config_builds_and_parses(folder, name, known_keys, library_parser):
    config = build_config({"__select__": {folder: name}}, known_keys=known_keys)
    assert config.flat or config.facade
    assert_parses_back(config, library_parser)


@pytest.mark.parametrize("name", TOP_LEVEL_CONFIGS)
def test_every_top_level_config_builds_and_parses(name, known_keys, library_parser):
    config = build_config(config_path(name), known_keys=known_keys)
    assert_parses_back(config, library_parser)


def test_tiny_gpt_is_tiny_fp32_and_deterministic(known_keys):
    flat = build_config({"__select__": {"model": "tiny_gpt"}}, known_keys=known_keys).flat
    expected = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 128,
                "seq_length": 128, "bf16": False, "fp16": False, "hidden_dropout": 0.0,
                "attention_dropout": 0.0}
    assert {key: flat[key] for key in expected} == expected


def test_llama_like_flags(known_keys, library_parser):
    config = build_config({"__select__": {"model": "llama_like"}}, known_keys=known_keys)
    argv = config.to_argv(library_parser)
    for flag in ("--swiglu", "--normalization=RMSNorm", "--position-embedding-type=rope",
                 "--untie-embeddings-and-output-weights", "--group-query-attention",
                 "--num-query-groups=2", "--disable-bias-linear"):
        assert flag in argv


def test_dynamic_cp_layout_has_what_dynamic_cp_requires(known_keys):
    flat = build_config({"__select__": {"parallel": "tp2_dp2"}}, known_keys=known_keys).flat
    assert flat["dynamic_context_parallel"] and flat["sequence_packing"]
    assert flat["calculate_per_token_loss"] and flat["max_seqlen_per_dp_cp_rank"] == 64


def test_examples_use_the_shipped_sections(known_keys):
    sft = build_config(config_path("sft_tiny_cpu"), known_keys=known_keys)
    assert sft.facade["flow_name"] == "gpt_sft" and sft.flat["sft"] and sft.flat["mock_data"]
    rl = build_config(config_path("rl_runtime_cpu"), known_keys=known_keys)
    assert rl.flat["swiglu"] and rl.flat["lr"] == 1e-5 and rl.flat["lr_decay_style"] == "constant"
    assert rl.sources["lr"] == "rl_runtime_cpu.yaml (__override__)"


def test_config_path_names_the_choices():
    with pytest.raises(ValueError, match="choices: rl_runtime_cpu, sft_tiny_cpu; did you mean"):
        config_path("sft_tiny")



LAYOUT_WORLD_SIZES = {"single": 1, "tp2": 2, "pp2": 2, "cp2": 2, "tp2_dp2": 4}


def parse_with_training_parser(source, known_keys, world_size=1):
    """The one validation path: the flags go through megatron.varlen_training.arguments.parse_args,
    and the facade's values through flag_values.parse_values to the same namespace.

    Keys the training parser does not define yet are left out (the fake parser above still
    checks them), so this pins types and validation rules, not the flag set.
    """
    arguments = pytest.importorskip("megatron.varlen_training.arguments")
    parser = arguments.build_parser()
    real_keys = known_keys_from_parser(parser)
    config = build_config(source, known_keys={**known_keys, **real_keys})
    flat = {key: value for key, value in config.flat.items() if key in real_keys}
    parsed = arguments.parse_args(flat_config_to_argv(flat, parser), world_size=world_size)
    # The facade's path (no command line) gives the same values.
    direct = parse_values(flat, world_size=world_size)
    assert vars(direct) == vars(parsed)


@pytest.mark.parametrize("name", TOP_LEVEL_CONFIGS)
def test_top_level_configs_pass_the_training_parser(name, known_keys):
    parse_with_training_parser(config_path(name), known_keys)


@pytest.mark.parametrize("folder, name", FOLDER_CONFIGS)
def test_each_choice_in_the_sft_example_passes_the_training_parser(folder, name, known_keys):
    source = {"__inherit__": "sft_tiny_cpu.yaml", "__select__": {folder: name}}
    world_size = LAYOUT_WORLD_SIZES.get(name, 1) if folder == "parallel" else 1
    parse_with_training_parser(source, known_keys, world_size)
