"""Qwen3-MoE from and to Hugging Face: after import our logits equal transformers' (fp32,
1e-5 relative) in TP1, TP2 (with sequence parallelism), EP2 and PP2; an export (from EP2, whose
experts live on two ranks) loads in transformers with the same logits and holds exactly the
tensors of the checkpoint it came from, so a re-import is bit-identical.

Reference: transformers' own Qwen3MoeForCausalLM on the random checkpoint it saved (4 experts,
top-2, renormalised top-k weights, layer 1 dense through ``mlp_only_layers``).
"""

import pytest
import torch

from tests.harness.extras import needs_extra
from tests.harness.multirank import run_distributed
from tests.unit_tests.varlen_training.hf.ranks import rank_import_export, rank_import_logits
from tests.unit_tests.varlen_training.hf.tiny_models import (
    hf_logits, model_argv, sample_tokens,
)

pytestmark = needs_extra("hf")

RTOL = 1e-5
MOE_CONFIG = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=24, rms_norm_eps=1e-5,
                  max_position_embeddings=16384, num_experts=4, num_experts_per_tok=2,
                  moe_intermediate_size=32, decoder_sparse_step=1, mlp_only_layers=[1],
                  norm_topk_prob=True, tie_word_embeddings=False)
LAYOUTS = {
    "tp1": ([], 1),
    "tp2_sp": (["--tensor-model-parallel-size", "2", "--sequence-parallel"], 2),
    "ep2": (["--expert-model-parallel-size", "2"], 2),
    "pp2": (["--pipeline-model-parallel-size", "2"], 2),
}


def _save_qwen3_moe(path) -> str:
    import transformers

    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**MOE_CONFIG))
    with torch.no_grad():
        for name, param in model.float().named_parameters():
            if "norm" in name:
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.2)
    model.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = _save_qwen3_moe(tmp_path_factory.mktemp("hf") / "qwen3_moe")
    tokens = sample_tokens()
    return path, tokens, hf_logits(path, tokens)


def _assert_logits_match(ours, reference, what):
    ours = ours[..., :reference.shape[-1]]
    scale = reference.abs().max().item()
    diff = (ours - reference).abs().max().item()
    assert diff <= RTOL * scale, f"{what}: max |ours - transformers| {diff:.3e} > {RTOL} x {scale}"


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_import_logits_match_transformers(checkpoint, layout):
    path, tokens, reference = checkpoint
    extra, world = LAYOUTS[layout]
    runs = {layout: model_argv(path, *extra)}
    results = run_distributed(rank_import_logits, world, args=(runs, tokens), timeout_s=240)
    owners = [r[layout] for r in results if r[layout]["logits"] is not None]
    assert owners, "no rank returned logits"
    _assert_logits_match(owners[-1]["logits"], reference, layout)


def test_export_from_ep2_loads_in_transformers_and_reimports_bit_identically(checkpoint,
                                                                             tmp_path):
    path, tokens, reference = checkpoint
    out = str(tmp_path / "exported")
    argv = model_argv(path, "--expert-model-parallel-size", "2")
    run_distributed(rank_import_export, 2, args=(argv, out), timeout_s=240)
    _assert_logits_match(hf_logits(out, tokens), reference, "export")
    from safetensors import safe_open

    with safe_open(f"{path}/model.safetensors", "pt") as original, \
            safe_open(f"{out}/model.safetensors", "pt") as exported:
        assert sorted(exported.keys()) == sorted(original.keys())
        differ = [k for k in original.keys()
                  if not torch.equal(original.get_tensor(k), exported.get_tensor(k))]
    assert differ == []
