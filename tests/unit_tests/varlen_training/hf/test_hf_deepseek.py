"""DeepSeek-V3 (MLA + MoE) from and to Hugging Face: after import, our logits on a packed THD
micro-batch of two sequences equal transformers' DeepseekV3ForCausalLM run on each sequence
alone (float32, 1e-5 relative), and the export holds exactly the tensors of the checkpoint it
came from, under a config.json that transformers loads into the same model. Imported on two
ranks (TP2 with sequence parallelism, EP2, PP2 with the dense layer alone on the first stage),
the model gives transformers' logits too: each layout splits other projections (MLA's
low-rank and up projections over TP, the routed experts and their bias over EP, the layers'
global indices over the stages) and must still read every tensor into its own place.

Reference: transformers' own DeepseekV3ForCausalLM on random tiny checkpoints it saved: three
layers (the first dense, then MoE with shared experts), sigmoid routing with a non-zero
``e_score_correction_bias`` (it changes which experts are chosen). Two shapes cover the
mappings that differ: query compression, interleaved rotated channels, plain RoPE and
group-limited routing; then queries without compression, rotated channels stored as halves
(``rope_interleave`` False, permuted on import and export) and YaRN with DeepSeek-V3's scales.
The first checkpoint also holds an MTP layer's tensors, as DeepSeek-V3's release does
(``model.layers.<num_hidden_layers>.*``): transformers skips them, so must the import, and the
export (which has no MTP layer) holds every other tensor.
"""

import json

import pytest
import torch

from tests.harness.extras import needs_extra
from tests.harness.multirank import run_distributed
from tests.unit_tests.varlen_training.hf.ranks import (
    rank_import_logits, rank_packed_logits_export,
)
from tests.unit_tests.varlen_training.hf.tiny_models import hf_logits, model_argv, sample_tokens

pytestmark = needs_extra("hf")

RTOL = 1e-5
LENGTHS = (11, 16)  # the two packed sequences
BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=16,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16,
            qk_nope_head_dim=8,
            qk_rope_head_dim=8, v_head_dim=6, n_routed_experts=8, first_k_dense_replace=1,
            routed_scaling_factor=2.5, norm_topk_prob=True, rms_norm_eps=1e-6,
            max_position_embeddings=16384, tie_word_embeddings=False)
SHAPES = {
    "q_lora_grouped": dict(q_lora_rank=12, rope_interleave=True, n_shared_experts=2,
                           num_experts_per_tok=4, n_group=4, topk_group=2),
    "no_q_lora_halves_yarn": dict(
        q_lora_rank=None, rope_interleave=False, n_shared_experts=1, num_experts_per_tok=2,
        n_group=1, topk_group=1,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 4096, "beta_fast": 32.0,
                         "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}),
}


# Two-rank layouts: (shape, flags). PP2 splits the 3 layers 1 + 2, so the first stage holds the
# dense layer and the second the MoE ones (their global indices 1 and 2).
LAYOUTS = {
    "q_lora_grouped_tp2_sp": ("q_lora_grouped", ["--tensor-model-parallel-size", "2",
                                                 "--sequence-parallel"]),
    "q_lora_grouped_ep2": ("q_lora_grouped", ["--expert-model-parallel-size", "2"]),
    "q_lora_grouped_pp2": ("q_lora_grouped", ["--pipeline-model-parallel-size", "2",
                                              "--decoder-first-pipeline-num-layers", "1"]),
    "no_q_lora_halves_yarn_tp2_sp": ("no_q_lora_halves_yarn", [
        "--tensor-model-parallel-size", "2", "--sequence-parallel"]),
}
DISPATCHER = ["--moe-token-dispatcher-type", "alltoall"]

WITH_MTP = "q_lora_grouped"  # its checkpoint also holds an MTP layer
MTP_PREFIX = f"model.layers.{BASE['num_hidden_layers']}."


def _add_mtp_layer(path) -> None:
    """An MTP layer's tensors after the last layer (the last layer's, renamed, plus its
    projection), as in DeepSeek-V3's release checkpoint."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(f"{path}/model.safetensors")
    last, mtp = f"model.layers.{BASE['num_hidden_layers'] - 1}.", MTP_PREFIX
    tensors.update({name.replace(last, mtp): t.clone() for name, t in tensors.items()
                    if name.startswith(last)})
    tensors[mtp + "eh_proj.weight"] = torch.randn(BASE["hidden_size"], 2 * BASE["hidden_size"])
    save_file(tensors, f"{path}/model.safetensors", metadata={"format": "pt"})


def _save_deepseek(path, shape: str) -> str:
    import transformers

    torch.manual_seed(0)
    config = transformers.DeepseekV3Config(**BASE, **SHAPES[shape])
    model = transformers.DeepseekV3ForCausalLM(config)
    with torch.no_grad():
        for name, param in model.float().named_parameters():
            if "norm" in name:  # non-trivial norm weights catch a missed or swapped norm
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.2)
        for layer in model.model.layers[BASE["first_k_dense_replace"]:]:
            layer.mlp.gate.e_score_correction_bias.normal_(0.0, 0.3)
    model.save_pretrained(path)
    if shape == WITH_MTP:
        _add_mtp_layer(path)
    return str(path)


@torch.no_grad()
def _hf_logits(path: str, sequences) -> torch.Tensor:
    """transformers' logits of each sequence run alone, concatenated [tokens, V]."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return torch.cat([model(input_ids=s[None]).logits[0].float() for s in sequences])


def _tensors(path: str) -> dict:
    from safetensors.torch import load_file

    return load_file(f"{path}/model.safetensors")


def _assert_close(ours, reference, what):
    diff = (ours[:, :reference.shape[-1]] - reference).abs().max().item()
    scale = reference.abs().max().item()
    assert diff <= RTOL * scale, f"{what}: max |ours - transformers| {diff:.3e} > {RTOL} x {scale}"


@pytest.fixture(scope="module")
def round_trips(tmp_path_factory):
    """Per shape: (checkpoint, export, sequences, our packed logits, transformers' logits of
    each sequence alone); one single-rank launch for both shapes."""
    root = tmp_path_factory.mktemp("deepseek")
    generator = torch.Generator().manual_seed(1)
    sequences = [torch.randint(0, BASE["vocab_size"], (n,), generator=generator)
                 for n in LENGTHS]
    paths = {name: _save_deepseek(root / name, name) for name in SHAPES}
    jobs = [(model_argv(paths[name], *DISPATCHER), sequences,
             str(root / f"{name}_export")) for name in SHAPES]
    logits = run_distributed(rank_packed_logits_export, 1, args=(jobs,), timeout_s=240)[0]
    return {name: (paths[name], job[2], sequences, ours, _hf_logits(paths[name], sequences))
            for name, job, ours in zip(SHAPES, jobs, logits)}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_packed_logits_match_transformers_per_sequence(round_trips, shape):
    _, _, _, ours, reference = round_trips[shape]
    _assert_close(ours, reference, shape)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_export_holds_the_checkpoint_tensors_and_loads_in_transformers(round_trips, shape):
    path, exported, sequences, _, reference = round_trips[shape]
    original, written = _tensors(path), _tensors(exported)
    mtp = [name for name in original if name.startswith(MTP_PREFIX)]
    assert bool(mtp) == (shape == WITH_MTP)
    original = {name: t for name, t in original.items() if name not in mtp}
    assert sorted(written) == sorted(original)
    assert [k for k in original if not torch.equal(original[k], written[k])] == []
    with open(f"{exported}/config.json", encoding="utf-8") as handle:
        config = json.load(handle)
    for key, value in SHAPES[shape].items():
        if key != "rope_parameters":
            assert config[key] == value, key
    _assert_close(_hf_logits(exported, sequences), reference, "export")


@pytest.fixture(scope="module")
def layout_logits(round_trips):
    """Per layout: (our logits of a [b, s] batch from the last stage, transformers'); one
    two-rank launch for every layout."""
    tokens = sample_tokens()
    runs = {name: model_argv(round_trips[shape][0], *DISPATCHER, *flags)
            for name, (shape, flags) in LAYOUTS.items()}
    per_rank = run_distributed(rank_import_logits, 2, args=(runs, tokens), timeout_s=240)
    references = {shape: hf_logits(round_trips[shape][0], tokens) for shape in SHAPES}
    return {name: ([r[name]["logits"] for r in per_rank if r[name]["logits"] is not None][-1],
                   references[shape]) for name, (shape, _) in LAYOUTS.items()}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_logits_on_two_ranks_match_transformers(layout_logits, layout):
    ours, reference = layout_logits[layout]
    _assert_close(ours.reshape(-1, ours.shape[-1]), reference.reshape(-1, reference.shape[-1]),
                  layout)
