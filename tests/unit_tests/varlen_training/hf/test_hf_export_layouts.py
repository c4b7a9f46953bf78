"""Export is layout-free: whatever the parallel layout a model lives on, its Hugging Face export
holds the same tensors.

- Import -> export with no training between, on every 2-rank layout (TP2, PP2, uneven PP2,
  PP2 + VPP, DP2; Qwen3-MoE on EP2, TP2 + EP2 with expert TP 1, PP2 + VPP; DeepSeek-V3 with
  its rotated channels stored as halves on TP2 + SP, EP2 and uneven PP2; a vocabulary padded
  for TP2): bit for bit the tensors of the checkpoint transformers saved, under the same
  names, and a ``config.json`` transformers reads as the source's (DeepSeek-V3's but for
  ``num_nextn_predict_layers``: the export writes no MTP layer). No arithmetic happens on the
  way, so nothing may differ at all. An earlier export in another layout in the same
  directory is replaced, not left for transformers to load.
- Training on layout X, then ``--save-hf``: the export equals the export of the same training on
  one rank (fp32 rounding), for tied embeddings on PP2, even and uneven (the first stage writes
  the embedding the last stage's output layer mirrors), DP2 with the distributed optimizer
  (also with its parameter all-gather overlapped), a packed SFT run with dynamic CP, and
  Qwen3-MoE on EP2;
  ``tools/export_hf.py`` on the distributed optimizer's Megatron checkpoint writes exactly the
  ``--save-hf`` tensors.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.harness.extras import needs_extra
from tests.harness.multirank import run_distributed
from tests.unit_tests.varlen_training.hf.ranks import rank_import_exports, rank_train
from tests.unit_tests.varlen_training.hf.test_hf_deepseek import _save_deepseek
from tests.unit_tests.varlen_training.hf.test_hf_moe import _save_qwen3_moe
from tests.unit_tests.varlen_training.hf.tiny_models import (
    DYNAMIC_CP, PACKED_SFT, model_argv, save_hf_model,
)

pytestmark = needs_extra("hf")

REPO = Path(__file__).resolve().parents[4]
TP2 = ["--tensor-model-parallel-size", "2"]
PP2 = ["--pipeline-model-parallel-size", "2"]
VPP = PP2 + ["--num-layers-per-virtual-pipeline-stage", "1"]
PP2_UNEVEN = PP2 + ["--decoder-first-pipeline-num-layers", "1"]
EP2 = ["--expert-model-parallel-size", "2"]
# (source, layout flags): Qwen2 is tied with QKV bias and GQA, Llama untied with Llama-3 RoPE.
IMPORT_EXPORT = {
    "qwen2_tp2": ("qwen2", TP2), "qwen2_pp2": ("qwen2", PP2), "qwen2_vpp": ("qwen2", VPP),
    "qwen2_dp2": ("qwen2", []), "llama_vpp": ("llama", VPP), "qwen3_pp2": ("qwen3", PP2),
    # uneven stages (one layer first, three last): the even split's tensors, bit for bit
    "qwen2_pp2_uneven": ("qwen2", PP2_UNEVEN),
    "moe_ep2": ("moe", EP2), "moe_vpp": ("moe", VPP),
    "moe_tp2_ep2": ("moe", TP2 + EP2 + ["--expert-tensor-parallel-size", "1",
                                        "--sequence-parallel"]),
    # MLA's column-parallel projections with the rotated rows permuted, the router's bias and
    # the shared experts split over TP; routed experts and their bias over EP
    "deepseek_tp2_sp": ("deepseek", TP2 + ["--sequence-parallel"]),
    "deepseek_ep2": ("deepseek", EP2),
    # its dense layer on the first stage, the MoE layers (global indices 1, 2) on the second
    "deepseek_pp2_uneven": ("deepseek", PP2_UNEVEN),
    # 250 ids padded to 256 rows for TP2: the padded rows are not exported
    "padded_tp2": ("padded", TP2 + ["--make-vocab-size-divisible-by", "8"]),
}
PADDED_VOCAB = 250
# Adam with eps 1 steps like momentum SGD: directions whose true gradient is 0 (the key bias:
# softmax ignores a per-query constant) carry only rounding noise, which a tiny eps would
# amplify into full learning-rate steps that differ between layouts.
TRAINING = ["--train-iters", "3", "--lr", "1e-1", "--adam-eps", "1.0", "--weight-decay", "0"]
# run: (source, reference run on one rank, layout flags)
TRAINED = {
    "tied_pp2": ("qwen2", "tied", PP2),
    "tied_pp2_uneven": ("qwen2", "tied", PP2_UNEVEN),
    "distopt_dp2": ("qwen2", "tied", ["--use-distributed-optimizer"]),
    # the last step's parameter all-gather is deferred to the next forward: --save-hf gathers
    "overlap_param_gather_dp2": ("qwen2", "tied", ["--use-distributed-optimizer",
                                                   "--overlap-grad-reduce",
                                                   "--overlap-param-gather"]),
    "packed_dynamic_cp": ("qwen2", "packed", PACKED_SFT + DYNAMIC_CP),
    "moe_ep2": ("moe", "moe", EP2),
}
REFERENCES = {"tied": ("qwen2", []), "packed": ("qwen2", PACKED_SFT), "moe": ("moe", [])}
TOOL_RUN = "distopt_dp2"
RTOL = 1e-5  # of each tensor's largest entry; fp32 rounding over 3 steps is ~1e-7
MOVED = 100 * RTOL  # training must move the weights far beyond the tolerance


def _load(directory) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors = {}
    for shard in sorted(Path(directory).glob("*.safetensors")):
        tensors.update(load_file(shard))
    return tensors


def _worst(ours: dict, reference: dict) -> tuple[float, str]:
    return max(((ours[k] - reference[k]).abs().max().item() / reference[k].abs().max().item(),
                k) for k in reference)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_layouts")
    paths = {family: save_hf_model(family, root / family) for family in ("llama", "qwen2",
                                                                         "qwen3")}
    paths["moe"] = _save_qwen3_moe(root / "moe")
    paths["deepseek"] = _save_deepseek(root / "deepseek", "no_q_lora_halves_yarn")
    paths["padded"] = save_hf_model("llama", root / "padded", vocab_size=PADDED_VOCAB)
    return root, paths


# Export directories that already hold an earlier export of ANOTHER model in another layout:
# (a single file where PP2 writes shards; shards and an index where TP2 writes a single file).
EARLIER_EXPORTS = {"qwen2_pp2": ["model.safetensors", "model-00001-of-00003.safetensors"],
                   "qwen2_tp2": ["model.safetensors.index.json",
                                 "model-00001-of-00002.safetensors"]}
WEIGHT_FILES = {"qwen2_pp2": ["model-00001-of-00002.safetensors",
                              "model-00002-of-00002.safetensors", "model.safetensors.index.json"],
                "qwen2_tp2": ["model.safetensors"]}


def _plant_earlier_export(out: Path, names: list[str], other_model: str) -> None:
    out.mkdir()
    for name in names:
        source = Path(other_model) / ("model.safetensors" if name.endswith(".safetensors")
                                      else name)
        if source.exists():
            shutil.copyfile(source, out / name)
        else:  # an index naming the planted shard
            (out / name).write_text('{"weight_map": {"lm_head.weight": '
                                    '"model-00001-of-00002.safetensors"}}')


@pytest.fixture(scope="module")
def untouched_exports(sources):
    root, paths = sources
    jobs, outs = [], {}
    for name, (family, layout) in IMPORT_EXPORT.items():
        outs[name] = root / f"export_{name}"
        if name in EARLIER_EXPORTS:
            _plant_earlier_export(outs[name], EARLIER_EXPORTS[name], paths["llama"])
        jobs.append((model_argv(paths[family], *layout), str(outs[name])))
    run_distributed(rank_import_exports, 2, args=(jobs,), timeout_s=300)
    return outs


@pytest.mark.parametrize("name", sorted(IMPORT_EXPORT))
def test_import_then_export_is_the_source_bit_for_bit(sources, untouched_exports, name):
    from transformers import AutoConfig

    _, paths = sources
    source = paths[IMPORT_EXPORT[name][0]]
    exported, original = _load(untouched_exports[name]), _load(source)
    assert sorted(exported) == sorted(original)
    assert [k for k in original if not torch.equal(exported[k], original[k])] == []
    theirs = AutoConfig.from_pretrained(source).to_dict()
    ours = AutoConfig.from_pretrained(untouched_exports[name]).to_dict()
    not_exported = {"_name_or_path", "num_nextn_predict_layers"}  # no MTP layer is written
    differ = {k: (v, ours.get(k)) for k, v in theirs.items()
              if k not in not_exported and ours.get(k) != v}
    assert differ == {}


@pytest.mark.parametrize("name", sorted(EARLIER_EXPORTS))
def test_an_earlier_export_in_another_layout_is_replaced(sources, untouched_exports, name):
    """transformers prefers model.safetensors to an index: an earlier single file left beside
    new shards would be what it loads."""
    from tests.unit_tests.varlen_training.hf.test_hf_import import _assert_logits_match
    from tests.unit_tests.varlen_training.hf.tiny_models import hf_logits, sample_tokens

    _, paths = sources
    out = untouched_exports[name]
    assert sorted(p.name for p in out.iterdir() if "safetensors" in p.name) == WEIGHT_FILES[name]
    tokens = sample_tokens()
    _assert_logits_match(hf_logits(out, tokens), hf_logits(paths[IMPORT_EXPORT[name][0]], tokens),
                         name)


@pytest.fixture(scope="module")
def trained(sources):
    root, paths = sources

    def argv(name, family, layout, *extra):
        return model_argv(paths[family], *TRAINING, *layout, "--save-hf", str(root / name),
                          *extra)

    references = {ref: argv(f"ref_{ref}", family, layout)
                  for ref, (family, layout) in REFERENCES.items()}
    runs = {name: argv(name, family, layout) for name, (family, _, layout) in TRAINED.items()}
    runs[TOOL_RUN] += ["--save", str(root / f"{TOOL_RUN}_ckpt")]
    losses = {**run_distributed(rank_train, 1, args=(references,), timeout_s=240)[0],
              **run_distributed(rank_train, 2, args=(runs,), timeout_s=300)[-1]}
    return root, paths, losses


@pytest.mark.parametrize("name", sorted(TRAINED))
def test_training_on_a_layout_exports_what_one_rank_exports(trained, name):
    root, paths, losses = trained
    family, reference, _ = TRAINED[name]
    ours, theirs = _load(root / name), _load(root / f"ref_{reference}")
    assert sorted(ours) == sorted(theirs)
    worst, key = _worst(ours, theirs)
    assert worst <= RTOL, f"{key}: {worst:.2e} of its largest entry"
    moved, _ = _worst(theirs, _load(paths[family]))
    assert moved > MOVED, "training did not change the model"
    torch.testing.assert_close(losses[name], losses[reference], rtol=1e-5, atol=0)


def test_export_tool_reads_the_distributed_optimizers_checkpoint(trained, tmp_path):
    root, paths, _ = trained
    out = tmp_path / "tool_export"
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "export_hf.py"), "--load",
         str(root / f"{TOOL_RUN}_ckpt"), "--save-hf", str(out), "--hf-checkpoint",
         paths[TRAINED[TOOL_RUN][0]]],
        capture_output=True, text=True, timeout=240, cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    ours, saved = _load(out), _load(root / TOOL_RUN)
    assert sorted(ours) == sorted(saved)
    assert [k for k in saved if not torch.equal(ours[k], saved[k])] == []
