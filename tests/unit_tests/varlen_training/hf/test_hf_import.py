"""After import from a Hugging Face checkpoint, our logits equal transformers' (fp32).

Reference: transformers' own forward on the checkpoint it saved. Ours: the model that
pretrain_gpt.py's code builds with --hf-checkpoint (architecture from config.json, weights read
slice by slice), in every layout: TP1, TP2, PP2 and PP2 with VPP.
"""

from pathlib import Path

import pytest
import torch

from tests.harness.extras import needs_extra
from tests.harness.multirank import run_distributed
from tests.unit_tests.varlen_training.hf.ranks import rank_import_logits
from tests.unit_tests.varlen_training.hf.tiny_models import (
    FAMILIES, hf_logits, model_argv, sample_tokens, save_hf_model,
)

pytestmark = needs_extra("hf")

RTOL = 1e-5
PADDED_CASE_VOCAB = 250
LAYOUTS_2_RANKS = {
    "tp2": ["--tensor-model-parallel-size", "2"],
    "pp2": ["--pipeline-model-parallel-size", "2"],
    "vpp": ["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"],
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    tokens = sample_tokens()
    paths = {family: save_hf_model(family, root / family) for family in FAMILIES}
    return paths, tokens, {family: hf_logits(path, tokens) for family, path in paths.items()}


def test_padded_vocabulary_rows_are_zero_and_excluded(tmp_path):
    # 250 ids, TP2 x --make-vocab-size-divisible-by 8: the model holds 256 rows, 6 padded.
    path = save_hf_model("llama", tmp_path / "v250", vocab_size=PADDED_CASE_VOCAB)
    tokens = sample_tokens() % PADDED_CASE_VOCAB
    runs = {"padded": model_argv(path, "--tensor-model-parallel-size", "2",
                                 "--make-vocab-size-divisible-by", "8")}
    got = _owner(run_distributed(rank_import_logits, 2, args=(runs, tokens), timeout_s=240),
                 "padded")
    assert got["logits"].shape[-1] == 256
    reference = hf_logits(path, tokens)
    _assert_logits_match(got["logits"][..., :PADDED_CASE_VOCAB], reference, "padded vocabulary")
    assert torch.count_nonzero(got["logits"][..., PADDED_CASE_VOCAB:]) == 0


def _owner(results: list[dict], name: str) -> dict:
    owners = [r[name] for r in results if r[name]["logits"] is not None]
    assert owners, f"{name}: no rank returned logits"
    return owners[-1]


def _assert_logits_match(ours: torch.Tensor, reference: torch.Tensor, what: str) -> None:
    ours = ours[..., :reference.shape[-1]]  # padded vocabulary rows are not part of the model
    scale = reference.abs().max().item()
    diff = (ours - reference).abs().max().item()
    assert diff <= RTOL * scale, (
        f"{what}: max |ours - transformers| {diff:.3e} > {RTOL} x {scale:.3f}")


def _hf_inv_freq(path) -> torch.Tensor:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    return model.model.rotary_emb.inv_freq.float()


def test_single_rank_logits_match_transformers(checkpoints):
    paths, tokens, reference = checkpoints
    runs = {family: model_argv(path) for family, path in paths.items()}
    results = run_distributed(rank_import_logits, 1, args=(runs, tokens), timeout_s=240)
    for family in FAMILIES:
        got = _owner(results, family)
        _assert_logits_match(got["logits"], reference[family], f"{family} tp1")
        torch.testing.assert_close(got["inv_freq"], _hf_inv_freq(paths[family]),
                                   rtol=1e-6, atol=0)


def test_parallel_layouts_match_transformers(checkpoints):
    paths, tokens, reference = checkpoints
    runs = {(family, layout): model_argv(path, *extra)
            for family, path in paths.items() for layout, extra in LAYOUTS_2_RANKS.items()}
    results = run_distributed(rank_import_logits, 2, args=(runs, tokens), timeout_s=300)
    for family, layout in runs:
        got = _owner(results, (family, layout))
        _assert_logits_match(got["logits"], reference[family], f"{family} {layout}")
        # Sliced reads: each rank read exactly the elements it holds (its TP/PP/VPP slices;
        # padded vocabulary rows are zero-filled, never read), never the whole model.
        for rank, result in enumerate(results):
            assert result[(family, layout)]["read"] == result[(family, layout)]["held"], rank


def test_single_file_beside_an_index_is_read_as_transformers_reads_it(tmp_path):
    """A directory with model.safetensors AND an index with shards (another model's): we import
    what transformers loads (it prefers the single file), not the other model."""
    import json
    import shutil

    from safetensors import safe_open

    from megatron.varlen_training.hf.safetensors_io import INDEX_FILE

    both = Path(save_hf_model("llama", tmp_path / "both", seed=0))
    other = Path(save_hf_model("llama", tmp_path / "other", seed=1))
    shard = "model-00001-of-00001.safetensors"
    shutil.copyfile(other / "model.safetensors", both / shard)
    with safe_open(str(both / shard), "pt") as handle:
        weight_map = {name: shard for name in handle.keys()}
    (both / INDEX_FILE).write_text(json.dumps({"weight_map": weight_map}))
    tokens = sample_tokens()
    got = _owner(run_distributed(rank_import_logits, 1, args=({"both": model_argv(both)},
                                                               tokens), timeout_s=120), "both")
    _assert_logits_match(got["logits"], hf_logits(both, tokens), "single file beside an index")
