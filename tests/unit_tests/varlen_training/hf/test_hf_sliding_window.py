"""Sliding-window checkpoints from and to Hugging Face: after import, our logits on a packed THD
micro-batch of three sequences equal transformers' run on each sequence alone (float32, 1e-5
relative), and the export (untouched weights) loads in transformers as the same model: the
same tensors, the same windowed layers, the same logits.

Reference: transformers' own Qwen2/Qwen3/Mistral/Qwen3-MoE on tiny random checkpoints it
saved, with a window of 4-5 keys on sequences of up to 16 tokens, and some layers full (Qwen2:
layer_types from max_window_layers; Qwen3: an explicit, non-contiguous layer_types; Mistral and
Qwen3-MoE: every layer). One single-rank launch for all four; the [b, s] path (no packing)
for two of them. The config-level mapping: test_hf_sliding_window_config.py.
"""

import json

import pytest
import torch

from tests.harness.extras import needs_extra
from tests.harness.multirank import run_distributed
from tests.unit_tests.varlen_training.hf.ranks import rank_import_logits, rank_packed_logits_export
from tests.unit_tests.varlen_training.hf.test_hf_deepseek import _assert_close, _tensors
from tests.unit_tests.varlen_training.hf.tiny_models import (
    VOCAB, hf_logits, model_argv, sample_tokens, save_hf_model,
)

pytestmark = needs_extra("hf")

LENGTHS = (11, 16, 6)  # the packed sequences, all but the last longer than the windows
CHECKPOINTS = {  # name: (family, window keys)
    "qwen2": ("qwen2", dict(use_sliding_window=True, sliding_window=4, max_window_layers=1)),
    "qwen3": ("qwen3", dict(use_sliding_window=True, sliding_window=5,
                            layer_types=["sliding_attention", "full_attention",
                                         "sliding_attention", "sliding_attention"])),
    "mistral": ("mistral", dict(sliding_window=4)),
    "qwen3_moe": ("qwen3_moe", dict(use_sliding_window=True, sliding_window=5)),
}
WINDOW_KEYS = ("use_sliding_window", "sliding_window", "layer_types")
DISPATCHER = ["--moe-token-dispatcher-type", "alltoall"]  # as test_hf_deepseek (MoE on one rank)


@torch.no_grad()
def _hf_logits(path, sequences) -> torch.Tensor:
    """transformers' logits of each sequence run alone, concatenated [tokens, V]."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return torch.cat([model(input_ids=s[None]).logits[0].float() for s in sequences])


def _num_layers(path) -> int:
    return _config(path)["num_hidden_layers"]


def _config(path) -> dict:
    with open(f"{path}/config.json", encoding="utf-8") as handle:
        return json.load(handle)


@pytest.fixture(scope="module")
def round_trips(tmp_path_factory):
    root = tmp_path_factory.mktemp("sliding_window")
    generator = torch.Generator().manual_seed(3)
    sequences = [torch.randint(0, VOCAB, (n,), generator=generator) for n in LENGTHS]
    paths = {name: save_hf_model(family, root / name, **window)
             for name, (family, window) in CHECKPOINTS.items()}
    jobs = [(model_argv(paths[name], *(DISPATCHER if name == "qwen3_moe" else [])), sequences,
             str(root / f"{name}_export")) for name in CHECKPOINTS]
    logits = run_distributed(rank_packed_logits_export, 1, args=(jobs,), timeout_s=240)[0]
    return {name: (paths[name], job[2], sequences, ours, _hf_logits(paths[name], sequences))
            for name, job, ours in zip(CHECKPOINTS, jobs, logits)}


@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_packed_logits_match_transformers_per_sequence(round_trips, name):
    path, _, sequences, ours, reference = round_trips[name]
    _assert_close(ours, reference, name)
    # The window matters here: the same weights with full attention give other logits.
    import transformers

    # (from_pretrained's keywords land after the config's own post-init: set the result)
    no_window = (dict(sliding_window=None) if name in ("mistral", "qwen3_moe") else
                 dict(layer_types=["full_attention"] * _num_layers(path)))
    full = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                             **no_window).eval()
    with torch.no_grad():
        unwindowed = torch.cat([full(input_ids=s[None]).logits[0] for s in sequences])
    assert not torch.allclose(unwindowed, reference, atol=1e-3), name


@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_export_is_the_same_windowed_model_in_transformers(round_trips, name):
    path, exported, sequences, _, reference = round_trips[name]
    original, written = _tensors(path), _tensors(exported)
    assert sorted(written) == sorted(original)
    assert [k for k in original if not torch.equal(original[k], written[k])] == []
    source, config = _config(path), _config(exported)
    assert config["architectures"] == source["architectures"]
    for key in WINDOW_KEYS:
        assert config.get(key) == source.get(key), key
    _assert_close(_hf_logits(exported, sequences), reference, f"{name} export")


def test_window_flags_follow_the_checkpoint(round_trips):
    """The checkpoint fixes the window as it fixes the other architecture flags: the same
    values may be given, others are a one-line conflict naming both."""
    from megatron.varlen_training.arguments import ArgumentValidationError
    from megatron.varlen_training.config.from_flags import parse_run_config

    qwen2 = round_trips["qwen2"][0]
    model = parse_run_config(model_argv(qwen2, "--window-size", "3,0", "--window-attn-skip-freq",
                                        "[0,1,1,1]"), world_size=1).model
    assert (model.window_size, model.window_attn_skip_freq) == ((3, 0), (0, 1, 1, 1))
    with pytest.raises(ArgumentValidationError, match=r"--window-size \(4, 0\) conflicts with "
                       r"the --hf-checkpoint .* config.json value \(3, 0\)"):
        parse_run_config(model_argv(qwen2, "--window-size", "4,0"), world_size=1)


def test_unpacked_batch_logits_match_transformers(round_trips):
    """The [b, s] path (no packing) windows the same layers: 4 sequences of 16 tokens."""
    tokens = sample_tokens()
    runs = {name: model_argv(round_trips[name][0]) for name in ("qwen3", "mistral")}
    ours = run_distributed(rank_import_logits, 1, args=(runs, tokens), timeout_s=240)[0]
    for name in runs:
        logits, reference = ours[name]["logits"], hf_logits(round_trips[name][0], tokens)
        _assert_close(logits.reshape(-1, logits.shape[-1]),
                      reference.reshape(-1, reference.shape[-1]), f"{name} [b, s]")
