"""Hugging Face sliding windows as config.json says them <-> our --window-size LEFT,0 and
--window-attn-skip-freq, checked against transformers itself: its mask overlay (how many keys a
query sees), its configs' layer_types (which layers are windowed), and a round trip through
our export's config.json that transformers loads back. Then the refusals, each one line.
No model is built and no process launched (the forward equivalence: test_hf_sliding_window.py).
"""

import json

import pytest

from megatron.varlen_training.arguments import ArgumentValidationError
from megatron.varlen_training.config import ModelConfig
from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.hf.config import (
    config_from_model, flag_values, parse_hf_config, to_config_json,
)
from megatron.varlen_training.hf.config_schema import HFConfigError
from tests.harness.extras import needs_extra
from tests.unit_tests.varlen_training.hf.tiny_models import SIZES, model_argv

pytestmark = needs_extra("hf")

LAYERS = SIZES["num_hidden_layers"]
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8)


def _hf_config(config_name: str, **window):
    import transformers

    config = getattr(transformers, config_name)(**SIZES, **window)
    config.architectures = [config_name.replace("Config", "ForCausalLM")]
    return config


def _raw(config, drop=()) -> dict:
    raw = json.loads(config.to_json_string(use_diff=False))
    return {key: value for key, value in raw.items() if key not in drop}


def _hf_windowed(config) -> list[bool]:
    """transformers' own choice: a layer is windowed when its attention gets a window."""
    kinds = getattr(config, "layer_types", None) or ["sliding_attention"] * LAYERS
    return [config.sliding_window is not None and kind == "sliding_attention" for kind in kinds]


def _ours_windowed(parsed) -> list[bool]:
    if parsed.window_size is None:
        return [False] * LAYERS
    return [bool(flag) for flag in parsed.window_attn_skip_freq or (1,) * LAYERS]


@pytest.mark.parametrize("width", [1, 4, 7])
def test_left_counts_the_keys_transformers_mask_shows_a_query(width):
    """Our LEFT earlier keys + the query itself = the keys transformers' overlay lets through."""
    import torch
    from transformers.masking_utils import and_masks, causal_mask_function, sliding_window_overlay

    both = and_masks(causal_mask_function, sliding_window_overlay(width))

    def mask(*indices):
        return bool(both(*map(torch.tensor, indices)))
    parsed = parse_hf_config(_raw(_hf_config("MistralConfig", sliding_window=width)))
    left = parsed.window_size[0]
    for query in range(12):
        seen = [key for key in range(query + 1) if mask(0, 0, query, key)]
        assert seen == list(range(max(0, query - left), query + 1)), (query, seen)


# name: (transformers config class, its window keys, keys config.json leaves out, keys it
# holds as released checkpoints write them: Qwen2.5's say sliding_window 32768 with the switch
# off, which transformers' own to_json would write as null)
CASES = {
    "qwen2_from_max_window_layers": ("Qwen2Config", dict(
        use_sliding_window=True, sliding_window=4, max_window_layers=1), ("layer_types",), {}),
    "qwen3_layer_types": ("Qwen3Config", dict(use_sliding_window=True, sliding_window=5,
                                              layer_types=["sliding_attention", "full_attention",
                                                           "sliding_attention",
                                                           "sliding_attention"]), (), {}),
    "qwen3_every_layer": ("Qwen3Config", dict(use_sliding_window=True, sliding_window=3,
                                              max_window_layers=0), (), {}),
    "qwen2_unused_window": ("Qwen2Config", dict(use_sliding_window=False, max_window_layers=0),
                            ("layer_types",), dict(sliding_window=32768)),
    "qwen2_no_sliding_layer": ("Qwen2Config", dict(use_sliding_window=True, sliding_window=4,
                                                   max_window_layers=LAYERS), (), {}),
    "mistral": ("MistralConfig", dict(sliding_window=6), (), {}),
    "mistral_no_window": ("MistralConfig", dict(sliding_window=None), (), {}),
    "mistral_default": ("MistralConfig", {}, ("sliding_window",), {}),
    "qwen3_moe": ("Qwen3MoeConfig", dict(use_sliding_window=True, sliding_window=4, **MOE), (),
                  {}),
    "qwen3_moe_unused_window": ("Qwen3MoeConfig", dict(**MOE), (), dict(sliding_window=4)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_windowed_layers_and_round_trip_match_transformers(case):
    import transformers

    config_name, window, dropped, released = CASES[case]
    raw = {**_raw(_hf_config(config_name, **window), drop=dropped), **released}
    reference = getattr(transformers, config_name)(**raw)  # what transformers reads from it
    parsed = parse_hf_config(raw)
    assert _ours_windowed(parsed) == _hf_windowed(reference)
    if parsed.window_size is not None:
        assert parsed.window_size == (reference.sliding_window - 1, 0)
    flags = flag_values(parsed)
    assert (flags["window_size"], flags["window_attn_skip_freq"]) == (
        parsed.window_size, None if parsed.window_attn_skip_freq is None
        else list(parsed.window_attn_skip_freq))
    # Our config.json, read back by transformers and by us, is the same window.
    written = to_config_json(parsed, "float32")
    loaded = transformers.AutoConfig.for_model(written.pop("model_type"), **written)
    assert _hf_windowed(loaded) == _hf_windowed(reference)
    if parsed.window_size is not None:
        assert loaded.sliding_window == reference.sliding_window
    assert parse_hf_config(to_config_json(parsed, "float32")) == parsed


# A Llama-layer model from pretrain_gpt.py's flags (no checkpoint).
LLAMA_LAYER = ["--num-layers", str(LAYERS), "--hidden-size", "64", "--num-attention-heads", "4",
               "--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear",
               "--position-embedding-type", "rope", "--seq-length", "16",
               "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "1",
               "--lr", "1e-3", "--mock-data", "--tokenizer-type", "NullTokenizer",
               "--vocab-size", "256"]


def _model(*flags: str) -> ModelConfig:
    return parse_run_config(LLAMA_LAYER + list(flags), world_size=1).model


@pytest.mark.parametrize("flags, architecture, kinds", [
    (["--add-qkv-bias", "--window-attn-skip-freq", "2"], "Qwen2ForCausalLM",
     ["sliding_attention", "full_attention"] * 2),
    (["--qk-layernorm"], "Qwen3ForCausalLM", ["sliding_attention"] * LAYERS),
    ([], "MistralForCausalLM", None),
    (["--num-experts", "4", "--qk-layernorm"], "Qwen3MoeForCausalLM", None),
])
def test_export_picks_the_architecture_that_holds_the_window(flags, architecture, kinds):
    raw = to_config_json(config_from_model(_model("--window-size", "7,0", *flags)), "float32")
    assert raw["architectures"] == [architecture] and raw["sliding_window"] == 8
    assert raw.get("layer_types") == kinds


@pytest.mark.parametrize("flags", [["--window-size=-1,0"], []])
def test_export_without_a_bounded_window_is_plain_llama(flags):
    raw = to_config_json(config_from_model(_model(*flags)), "float32")
    assert raw["architectures"] == ["LlamaForCausalLM"] and "sliding_window" not in raw


@pytest.mark.parametrize("extra, expected", [
    (["--num-experts", "4", "--qk-layernorm", "--window-attn-skip-freq", "2"],
     "Qwen3Moe windows every layer or none, not some layers only (--window-attn-skip-freq 2)"),
    (["--window-attn-skip-freq", "2"], "Mistral windows every layer or none, not some layers "
                                       "only (--window-attn-skip-freq 2)"),
    (["--window-attn-skip-freq", "[1,0,1,1]"], "(--window-attn-skip-freq [1,0,1,1])"),
    (["--multi-latent-attention", "--num-experts", "4", "--moe-router-score-function",
      "sigmoid", "--moe-router-enable-expert-bias", "--qk-layernorm"],
     "--window-size 3,0 is not held by DeepseekV3 (it has no sliding window)"),
])
def test_save_hf_refuses_at_start_up_in_one_line(tmp_path, extra, expected):
    flags = ["--window-size", "3,0", "--save-hf", str(tmp_path / "out"), *extra]
    with pytest.raises(ArgumentValidationError) as err:
        _model(*flags)
    message = str(err.value)
    assert "\n" not in message and message.startswith("--save-hf: export to Hugging Face")
    assert expected in message, message


@pytest.mark.parametrize("changes, expected", [
    (dict(architectures=["LlamaForCausalLM"], model_type="llama", use_sliding_window=True),
     "unsupported value use_sliding_window=True for LlamaForCausalLM"),
    (dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", **MOE,
          use_sliding_window=True, layer_types=["sliding_attention"] * LAYERS),
     "unsupported layer_types"),
    (dict(use_sliding_window=True, sliding_window=0), "sliding_window 0 must be a positive"),
    (dict(use_sliding_window=True, layer_types=["sliding_attention"] * 3),
     "unsupported layer_types"),
    (dict(use_sliding_window=False, layer_types=["sliding_attention"] * LAYERS),
     "names 'sliding_attention' layers but no window is set"),
])
def test_import_refuses_a_window_it_cannot_map(changes, expected):
    raw = {**_raw(_hf_config("Qwen2Config")), **changes}
    with pytest.raises(HFConfigError, match=expected) as err:
        parse_hf_config(raw)
    assert "\n" not in str(err.value)


def test_export_tool_refuses_at_start_up_in_one_line(tmp_path, capsys):
    """tools/export_hf.py parses the run's flags first: the refusal comes before any model or
    checkpoint is read (--load is an empty directory here), one line and exit code 2."""
    from megatron.varlen_training.hf.export_tool import main

    with pytest.raises(SystemExit) as exited:
        main(LLAMA_LAYER + ["--load", str(tmp_path), "--save-hf", str(tmp_path / "out"),
                            "--window-size", "3,0", "--window-attn-skip-freq", "2"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and len(lines) == 1, lines
    assert "Mistral windows every layer or none" in lines[0] and "export_hf.py" in lines[0]
