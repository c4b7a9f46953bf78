"""flat_config_to_argv against a fake argparse parser: every kind of argument round-trips."""

import argparse
import json

import pytest

from megatron.wrap.config import ConfigError, flat_config_to_argv, known_keys_from_parser


@pytest.fixture
def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fake", exit_on_error=False)
    parser.add_argument("--swiglu", action="store_true")
    parser.add_argument("--no-bias", action="store_false", dest="bias")
    parser.add_argument("--num-layers", type=int)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--tokenizer-model", type=str)
    parser.add_argument("--data-path", nargs="+")
    parser.add_argument("--split-sizes", nargs=3, type=int)
    parser.add_argument("--normalization", choices=["LayerNorm", "RMSNorm"], default="LayerNorm")
    parser.add_argument("--tag", action="append")
    parser.add_argument("--fused", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--fp8-recipe-const", dest="fp8", action="store_const", const=2)
    parser.add_argument("--hybrid-context-parallel", "--dynamic-context-parallel",
                        dest="dynamic_context_parallel", action="store_true")
    parser.add_argument("--mock-config-json", type=str)
    parser.add_argument("--seq", "-s", dest="seq_length", type=int)
    return parser


def round_trip(parser, flat):
    argv = flat_config_to_argv(flat, parser)
    return argv, vars(parser.parse_args(argv))


def test_every_kind_of_argument_round_trips(parser):
    flat = {
        "swiglu": True, "bias": False, "num_layers": 2, "lr": 1.2345678901234e-4,
        "tokenizer_model": "tok.model", "data_path": ["a", "b"], "split_sizes": [9, 1, 0],
        "normalization": "RMSNorm", "tag": ["x", "y"], "fused": False, "fp8": 2,
        "dynamic_context_parallel": True, "seq_length": 128,
    }
    _, namespace = round_trip(parser, flat)
    for key, value in flat.items():
        assert namespace[key] == value, key


def test_flags_are_spelled_as_expected(parser):
    flat = {"swiglu": True, "num_layers": 2, "data_path": ["a", "b"], "tag": ["x", "y"],
            "fused": False, "dynamic_context_parallel": True, "seq_length": 8}
    assert flat_config_to_argv(flat, parser) == [
        "--swiglu", "--num-layers=2", "--data-path", "a", "b", "--tag=x", "--tag=y",
        "--no-fused", "--dynamic-context-parallel", "--seq=8",
    ]


def test_defaults_and_none_add_no_flags(parser):
    flat = {"swiglu": False, "bias": True, "fused": True, "lr": None, "num_layers": None}
    assert flat_config_to_argv(flat, parser) == ["--fused"]
    flat.pop("fused")
    assert flat_config_to_argv(flat, parser) == []


def test_scalar_for_nargs_is_a_one_item_list(parser):
    _, namespace = round_trip(parser, {"data_path": "only"})
    assert namespace["data_path"] == ["only"]


def test_negative_numbers_are_values(parser):
    _, namespace = round_trip(parser, {"lr": -1.0, "num_layers": -3})
    assert (namespace["lr"], namespace["num_layers"]) == (-1.0, -3)


def test_mapping_becomes_json(parser):
    mock = {"mode": "distribution", "min_seq_len": 16}
    _, namespace = round_trip(parser, {"mock_config_json": mock})
    assert json.loads(namespace["mock_config_json"]) == mock


def test_invalid_choice_is_left_to_the_parser(parser):
    argv = flat_config_to_argv({"normalization": "BatchNorm"}, parser)
    with pytest.raises(argparse.ArgumentError, match="invalid choice"):
        parser.parse_args(argv)


@pytest.mark.parametrize(
    "flat, message",
    [
        ({"num_layer": 2}, "'num_layer' is not an argument of the parser; did you mean"),
        ({"swiglu": 1}, r"cannot set 'swiglu' to 1: no flag stores that value \(--swiglu\)"),
        ({"bias": "yes"}, "cannot set 'bias' to 'yes'"),
        ({"fused": "no"}, "'fused' must be true or false"),
        ({"num_layers": [1, 2]}, "'num_layers' takes one value"),
    ],
)
def test_inexpressible_values_are_errors(parser, flat, message):
    with pytest.raises(ConfigError, match=message):
        flat_config_to_argv(flat, parser)


def test_false_needs_a_flag_when_the_default_is_true():
    parser = argparse.ArgumentParser()
    parser.add_argument("--use-cpu", action="store_true")
    parser.set_defaults(use_cpu=True)
    with pytest.raises(ConfigError, match="cannot set 'use_cpu' to False"):
        flat_config_to_argv({"use_cpu": False}, parser)


def test_known_keys_from_parser_skips_help_and_keeps_first_default():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bias", action="store_true", default=True)
    parser.add_argument("--no-bias", dest="bias", action="store_false")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("positional")
    assert known_keys_from_parser(parser) == {"bias": True, "lr": 0.1}
