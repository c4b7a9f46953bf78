"""Gradients of a packed step of an imported Hugging Face model equal transformers' own.

One forward-backward of a packed multi-sample global batch (mock SFT, lengths 4..32, every
sample a sequence of its pack), single rank and dynamic CP on 2 ranks (long sequences split
over a CP group of 2), from a tiny llama / qwen2 / qwen3 checkpoint. Our side writes each
parameter's gradient in its place and exports the model through our exporter (so names,
QKV / gate-up layouts and tied embeddings are mapped by the code under test's inverse, which
test_hf_export proves against transformers); the reference is transformers' float32 gradient
of the same loss: the sum of every sample's masked token losses, each sample run alone,
divided by the batch's trained-token count (the global per-token mean). Every tensor must agree
within RTOL of its norm.
"""

import pytest
import torch

from tests.harness.extras import needs_extra
from tests.harness.multirank import run_distributed
from tests.unit_tests.varlen_training.hf.ranks import rank_gradient_export
from tests.unit_tests.varlen_training.hf.tiny_models import (DYNAMIC_CP, PACKED_SFT, model_argv,
                                                             save_hf_model)

pytestmark = needs_extra("hf")

RTOL = 1e-5
PACKED = PACKED_SFT + ["--calculate-per-token-loss"]
CASES = {  # name: (family, extra flags, world size)
    "llama_single": ("llama", [], 1),
    "qwen2_dynamic_cp": ("qwen2", DYNAMIC_CP, 2),
    "qwen3_dynamic_cp": ("qwen3", DYNAMIC_CP, 2),
}


def hf_gradients(path: str, samples: list[dict]) -> dict[str, torch.Tensor]:
    """transformers' float32 gradient of sum over samples of masked token CE / trained tokens."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.train()  # dropout is 0 in these configs
    trained = sum(float(s["loss_mask"][: s["length"]].sum()) for s in samples)
    model.zero_grad()
    for sample in samples:
        length = sample["length"]
        logits = model(input_ids=sample["tokens"][:length][None]).logits[0].float()
        losses = torch.nn.functional.cross_entropy(logits, sample["labels"][:length],
                                                   reduction="none")
        (torch.sum(losses * sample["loss_mask"][:length].float()) / trained).backward()
    return {name: param.grad.detach().clone() for name, param in model.named_parameters()}


def exported_tensors(path: str) -> dict[str, torch.Tensor]:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return {name: param.detach().clone() for name, param in model.named_parameters()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_packed_step_gradients_match_transformers(tmp_path, case):
    family, extra, world = CASES[case]
    path = save_hf_model(family, tmp_path / family)
    out_dir = str(tmp_path / "grads")
    results = run_distributed(rank_gradient_export, world,
                              args=(model_argv(path) + PACKED + extra, out_dir), timeout_s=240)
    if extra:
        assert max(r["max_cp"] for r in results) == 2, "no sequence ran on a CP group of 2"
    want = hf_gradients(path, results[0]["samples"])
    got = exported_tensors(out_dir)
    assert set(got) == set(want)
    for name, reference in want.items():
        gap = (got[name] - reference).norm() / reference.norm()
        assert gap <= RTOL, f"{case} {name}: gradient off by {gap:.2e} of its norm"
