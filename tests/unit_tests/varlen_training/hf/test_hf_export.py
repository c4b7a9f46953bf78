"""Export after training: transformers loads it, its logits equal ours, and importing the export
gives back exactly the weights we had (round trip); tools/export_hf.py writes the same tensors
from the Megatron checkpoint of the same run.
"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.harness.extras import needs_extra
from tests.harness.multirank import run_distributed
from tests.unit_tests.varlen_training.hf.ranks import rank_train_export
from tests.unit_tests.varlen_training.hf.test_hf_import import _assert_logits_match
from tests.unit_tests.varlen_training.hf.tiny_models import (
    hf_logits, model_argv, sample_tokens, save_hf_model,
)

pytestmark = needs_extra("hf")

REPO = Path(__file__).resolve().parents[4]
TRAIN_ITERS = "2"
# (family, layout flags): PP2 writes one shard per stage plus an index; TP2 gathers over TP.
RUNS = {
    "llama_pp2": ("llama", ["--pipeline-model-parallel-size", "2"]),
    "qwen2_tp2": ("qwen2", ["--tensor-model-parallel-size", "2"]),
    "qwen3_tp2": ("qwen3", ["--tensor-model-parallel-size", "2"]),
}
TOOL_RUN = "llama_pp2"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_export")
    tokens = sample_tokens()
    runs, dirs = {}, {}
    for name, (family, layout) in RUNS.items():
        original = save_hf_model(family, root / f"{name}_original")
        out, ckpt = root / f"{name}_export", root / f"{name}_ckpt"
        train = model_argv(original, *layout, "--train-iters", TRAIN_ITERS, "--save-hf",
                           str(out))
        if name == TOOL_RUN:  # a Megatron checkpoint only where the export tool reads one
            train += ["--save", str(ckpt)]
        runs[name] = (train, model_argv(out, *layout))
        dirs[name] = (original, out, ckpt)
    results = run_distributed(rank_train_export, 2, args=(runs, tokens), timeout_s=300)
    return tokens, dirs, results


def _owner(results, name):
    return [r[name] for r in results if r[name]["logits"] is not None][-1]


@pytest.mark.parametrize("name", sorted(RUNS))
def test_transformers_loads_export_with_equal_logits(exported, name):
    tokens, dirs, results = exported
    original, out, _ = dirs[name]
    ours = _owner(results, name)
    assert ours["history"][-1]["lm_loss"] is not None
    _assert_logits_match(ours["logits"], hf_logits(out, tokens), f"{name} export")
    # Training changed the model: the export is not just the imported checkpoint.
    assert not torch.allclose(hf_logits(out, tokens), hf_logits(original, tokens), atol=1e-4)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_import_of_export_is_bit_identical(exported, name):
    _, _, results = exported
    for rank_result in results:
        assert rank_result[name]["num_params"] > 0
        assert rank_result[name]["differ"] == [], rank_result[name]["differ"]


def test_export_tool_from_megatron_checkpoint(exported, tmp_path):
    from safetensors.torch import load_file

    _, dirs, _ = exported
    original, out, ckpt = dirs[TOOL_RUN]
    tool_out = tmp_path / "tool_export"
    # One process (the run was PP2: dist_checkpointing reshards), no sys.path set-up.
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "export_hf.py"), "--load", str(ckpt),
         "--save-hf", str(tool_out), "--hf-checkpoint", str(original)],
        capture_output=True, text=True, timeout=240, cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    mine = load_file(tool_out / "model.safetensors")
    trained = {}
    for shard in sorted(out.glob("model-*.safetensors")):
        trained.update(load_file(shard))
    assert sorted(mine) == sorted(trained)
    for key in trained:
        assert torch.equal(mine[key], trained[key]), key


def test_bf16_import_then_export_is_the_bf16_cast(tmp_path):
    import json

    from safetensors.torch import load_file

    from tests.unit_tests.varlen_training.hf.ranks import rank_import_export

    original = save_hf_model("qwen3", tmp_path / "original")
    out = tmp_path / "bf16_export"
    run_distributed(rank_import_export, 1, args=(model_argv(original, "--bf16"), str(out)),
                    timeout_s=120)
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    exported, source = load_file(out / "model.safetensors"), load_file(
        Path(original) / "model.safetensors")
    assert sorted(exported) == sorted(source)
    for key, tensor in source.items():
        assert exported[key].dtype == torch.bfloat16
        assert torch.equal(exported[key], tensor.to(torch.bfloat16)), key
