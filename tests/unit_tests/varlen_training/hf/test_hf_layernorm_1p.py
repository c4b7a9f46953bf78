"""--apply-layernorm-1p with Hugging Face checkpoints: transformers' norms hold gamma, ours
gamma - 1. Import subtracts 1 and export adds it back, so a Qwen3 checkpoint (input, post-
attention, final and q/k norms) imported with the flag gives transformers' logits, and its
export is the source again (norm weights within float32 rounding of x - 1 + 1, everything else
bit for bit) -- on DP2 and on uneven PP2 stages.

Reference: transformers itself (its forward of the saved source) and the source's tensors.
"""

import pytest
import torch

from tests.harness.extras import needs_extra
from tests.harness.multirank import run_distributed
from tests.unit_tests.varlen_training.hf.ranks import rank_import_exports, rank_import_logits
from tests.unit_tests.varlen_training.hf.test_hf_export_layouts import _load
from tests.unit_tests.varlen_training.hf.test_hf_import import _assert_logits_match
from tests.unit_tests.varlen_training.hf.tiny_models import (
    hf_logits, model_argv, sample_tokens, save_hf_model,
)

pytestmark = needs_extra("hf")

FLAG = "--apply-layernorm-1p"
LAYOUTS = {"dp2": [], "pp2_uneven": ["--pipeline-model-parallel-size", "2",
                                     "--decoder-last-pipeline-num-layers", "1"]}
NORM_ATOL = 1e-6  # (x - 1) + 1 in float32 for x near 1: one rounding of each step


def _import_and_export(runs: dict, tokens: torch.Tensor, jobs: list) -> dict:
    logits = rank_import_logits(runs, tokens)
    rank_import_exports(jobs)
    return logits


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_1p")
    source = save_hf_model("qwen3", root / "source")
    tokens = sample_tokens()
    runs = {name: model_argv(source, FLAG, *layout) for name, layout in LAYOUTS.items()}
    jobs = [(argv, str(root / f"export_{name}")) for name, argv in runs.items()]
    per_rank = run_distributed(_import_and_export, 2, args=(runs, tokens, jobs), timeout_s=300)
    return root, source, tokens, per_rank


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_import_with_zero_centered_norms_gives_transformers_logits(results, name):
    _, source, tokens, per_rank = results
    ours = [rank[name]["logits"] for rank in per_rank if rank[name]["logits"] is not None][-1]
    _assert_logits_match(ours, hf_logits(source, tokens), f"{name} with {FLAG}")


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_export_adds_the_one_back(results, name):
    root, source, _, _ = results
    exported, original = _load(root / f"export_{name}"), _load(source)
    assert sorted(exported) == sorted(original)
    norms = [key for key in original if "norm" in key]
    assert len(norms) == 4 * 4 + 1  # four per layer (input, post-attention, q, k) and final
    for key, tensor in original.items():
        if key in norms:
            assert not torch.allclose(tensor, torch.ones_like(tensor))  # a real gamma
            torch.testing.assert_close(exported[key], tensor, rtol=0, atol=NORM_ATOL)
        else:
            assert torch.equal(exported[key], tensor), key
