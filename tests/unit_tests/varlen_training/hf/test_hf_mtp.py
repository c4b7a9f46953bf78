"""MTP and Hugging Face checkpoints: Llama/Qwen have no MTP layers, so ``--hf-checkpoint`` and
``--save-hf`` with ``--mtp-num-layers`` are refused in one line (exit code 2 through the
tools), and so is ``MegatronWrap.save_pretrained`` of an MTP model (``config_from_model``).
The refusal names the way out: ``tools/export_hf.py`` without ``--mtp-num-layers`` exports the
model without its MTP layers from a ``--save`` checkpoint.

That way out is checked where it is most fragile: an MTP model with tied embeddings on PP2,
whose last stage holds the MTP layers and a copy of the word embedding but no output weight of
its own. Its export equals the export of the same training on one rank (fp32 rounding), and the
tensors are exactly those of a Llama model (no MTP tensor, no second embedding).
"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from megatron.varlen_training.arguments import ArgumentValidationError
from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.hf.config import HFConfigError, config_from_model
from tests.harness.extras import needs_extra
from tests.harness.multirank import run_distributed
from tests.unit_tests.varlen_training.hf.ranks import rank_export_checkpoint, rank_train
from tests.unit_tests.varlen_training.hf.test_hf_export_layouts import RTOL, _load, _worst
from tests.unit_tests.varlen_training.hf.tiny_models import model_argv, save_hf_model

pytestmark = needs_extra("hf")

REPO = Path(__file__).resolve().parents[4]
MTP = ["--mtp-num-layers", "1"]
# A Llama-shaped model with tied embeddings and GQA, trained from scratch (an MTP run cannot
# start from a Hugging Face checkpoint).
LLAMA_SHAPE = [
    "--num-layers", "4", "--hidden-size", "64", "--ffn-hidden-size", "96",
    "--num-attention-heads", "4", "--group-query-attention", "--num-query-groups", "2",
    "--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear",
    "--position-embedding-type", "rope", "--max-position-embeddings", "64",
    "--make-vocab-size-divisible-by", "1", "--hidden-dropout", "0", "--attention-dropout", "0"]
ARCHITECTURE = LLAMA_SHAPE + ["--vocab-size", "256"]
TRAINING = ["--seq-length", "16", "--tokenizer-type", "NullTokenizer", "--mock-data",
            "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "3",
            "--lr", "1e-1", "--adam-eps", "1.0", "--weight-decay", "0", "--eval-iters", "0",
            "--seed", "7", "--log-interval", "1"]
LLAMA_TENSORS_PER_LAYER = 9  # 2 norms, q/k/v/o, gate/up/down


def _error(argv) -> str:
    with pytest.raises(ArgumentValidationError) as err:
        parse_run_config(argv, world_size=1)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_hf_checkpoint_with_mtp_is_refused(tmp_path):
    source = save_hf_model("llama", tmp_path / "llama")
    assert "--hf-checkpoint does not support --mtp-num-layers 1" in _error(
        model_argv(source, *MTP))


def test_save_hf_with_mtp_is_refused_naming_the_way_out():
    message = _error(ARCHITECTURE + TRAINING + MTP + ["--save-hf", "/tmp/unused"])
    assert message.startswith("--save-hf does not support --mtp-num-layers 1")
    assert "tools/export_hf.py on it without --mtp-num-layers" in message


def test_export_tool_with_mtp_exits_2_with_one_line(tmp_path, capsys):
    from megatron.varlen_training.hf import export_tool

    with pytest.raises(SystemExit) as exit_info:
        export_tool.main(["--load", str(tmp_path), "--save-hf", str(tmp_path / "out"),
                          *ARCHITECTURE, *MTP])
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("export_hf.py: error: --save-hf does not support "
                               "--mtp-num-layers 1")


def test_save_pretrained_of_an_mtp_model_is_refused():
    run = parse_run_config(ARCHITECTURE + TRAINING + MTP, world_size=1)
    with pytest.raises(HFConfigError, match="does not support --mtp-num-layers 1"):
        config_from_model(run.model)


def _export(checkpoint: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "tools" / "export_hf.py"), "--load", str(checkpoint),
         "--save-hf", str(out), *ARCHITECTURE, *extra],
        capture_output=True, text=True, timeout=240, cwd=out.parent,
        env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})


def test_mtp_model_with_tied_embeddings_on_pp2_exports_without_its_mtp_layers(tmp_path):
    from transformers import AutoModelForCausalLM

    argv = ARCHITECTURE + TRAINING + MTP
    run_distributed(rank_train, 1, args=({"one": argv + ["--save", str(tmp_path / "one")]},),
                    timeout_s=180)
    run_distributed(rank_train, 2, args=({"pp2": argv + [
        "--pipeline-model-parallel-size", "2", "--save", str(tmp_path / "pp2")]},),
        timeout_s=180)
    # The reference: the one-rank checkpoint through the tool's own functions, in a rank, into
    # a directory an earlier export left a generation config in: this model has no token ids
    # (no --hf-checkpoint, no Hugging Face tokenizer), so the other model's file must go.
    (tmp_path / "one_hf").mkdir()
    (tmp_path / "one_hf" / "generation_config.json").write_text('{"eos_token_id": 7}')
    run_distributed(rank_export_checkpoint, 1, args=(
        ARCHITECTURE + TRAINING + ["--load", str(tmp_path / "one")], str(tmp_path / "one_hf")),
        timeout_s=120)
    proc = _export(tmp_path / "pp2", tmp_path / "pp2_hf")  # one process reads the PP2 save
    assert proc.returncode == 0, proc.stderr[-3000:]
    ours, reference = _load(tmp_path / "pp2_hf"), _load(tmp_path / "one_hf")
    assert sorted(ours) == sorted(reference)
    assert len(ours) == 2 + 4 * LLAMA_TENSORS_PER_LAYER  # embedding, final norm; tied: no head
    worst, key = _worst(ours, reference)
    assert worst <= RTOL, f"{key}: {worst:.2e} of its largest entry"
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "pp2_hf")
    assert model.config.tie_word_embeddings
    assert torch.equal(model.lm_head.weight, ours["model.embed_tokens.weight"])
    assert not (tmp_path / "one_hf" / "generation_config.json").exists()
