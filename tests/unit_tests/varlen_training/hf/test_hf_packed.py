"""Packed THD with dynamic CP, initialised from a Hugging Face checkpoint: every trained token's
loss equals transformers' loss for that token with its sequence run alone (no packing).

Mock SFT lengths up to 32 with a budget of 16 tokens per rank, so long sequences run on a CP
group of 2 ranks. Each token is identified by (position, input token, label) in its sample.
"""

import pytest
import torch

from tests.harness.extras import needs_extra
from tests.harness.multirank import run_distributed
from tests.unit_tests.varlen_training.hf.ranks import rank_packed_token_losses
from tests.unit_tests.varlen_training.hf.tiny_models import (DYNAMIC_CP, PACKED_SFT, model_argv,
                                                             save_hf_model)

pytestmark = needs_extra("hf")

RTOL = 1e-5
PACKED = PACKED_SFT + DYNAMIC_CP


@torch.no_grad()
def _hf_token_losses(path, samples) -> dict:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    expected = {}
    for sample in samples:
        length = sample["length"]
        tokens, labels = sample["tokens"][:length], sample["labels"][:length]
        logits = model(input_ids=tokens[None]).logits[0].float()
        losses = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
        for p in range(length):
            if sample["loss_mask"][p] > 0:
                key = (p, int(tokens[p]), int(labels[p]))
                assert key not in expected, f"ambiguous token key {key}: change the seed"
                expected[key] = float(losses[p])
    return expected


@pytest.mark.parametrize("family", ["qwen3"])
def test_packed_dynamic_cp_token_losses_match_transformers(tmp_path, family):
    path = save_hf_model(family, tmp_path / family)
    argv = model_argv(path) + PACKED
    results = run_distributed(rank_packed_token_losses, 2, args=(argv,), timeout_s=240)
    assert max(r["max_cp"] for r in results) == 2, "no sequence ran on a CP group of 2"
    expected = _hf_token_losses(path, results[0]["samples"])
    seen = {}
    for row in torch.cat([r["records"] for r in results]).tolist():
        key = (int(row[0]), int(row[1]), int(row[2]))
        assert key in expected, f"token {key} is not a trained token of the batch"
        assert key not in seen, f"token {key} was computed twice"
        seen[key] = row[3]
    assert set(seen) == set(expected), f"{len(set(expected) - set(seen))} tokens never computed"
    for key, loss in seen.items():
        assert abs(loss - expected[key]) <= RTOL * abs(expected[key]) + 1e-6, (key, loss,
                                                                              expected[key])
