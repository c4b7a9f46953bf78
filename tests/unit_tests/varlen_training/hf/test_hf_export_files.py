"""What an export carries besides the weights, judged by transformers itself: the source's
``config.json`` fields, its ``generation_config.json`` (sampling settings included) and its
tokenizer survive import -> export unchanged.

Also: an export into the source's own directory keeps its generation config, and
``tools/export_hf.py`` on a model trained from scratch takes the vocabulary and the special token
ids from its Hugging Face tokenizer.

The source is a Llama checkpoint saved by transformers with a non-default generation config
(sampling, temperature, top-p, a pad id), a pad id in ``config.json``, Llama-3 RoPE scaling and
a tokenizer with a chat template in the same directory, as a Hub checkpoint has. The export runs
with ``--tokenizer-type NullTokenizer`` (as ``tools/export_hf.py --hf-checkpoint DIR`` does when
given no tokenizer flags): the tokenizer the model's ids belong to is the checkpoint's.
"""

import json

import pytest
import torch

from tests.harness.extras import needs_extra
from tests.harness.multirank import run_distributed
from tests.unit_tests.varlen_training.hf.ranks import rank_import_export
from tests.unit_tests.varlen_training.hf.tiny_models import (
    build_hf_model, model_argv, save_tokenizer,
)

pytestmark = needs_extra("hf")

PAD_TOKEN_ID = 0
GENERATION = dict(do_sample=True, temperature=0.6, top_p=0.9, top_k=20, max_new_tokens=64,
                  repetition_penalty=1.05, bos_token_id=1, eos_token_id=[2, 3],
                  pad_token_id=PAD_TOKEN_ID)
# Keys whose value names the directory or the writer, not the model.
_PROVENANCE = {"_name_or_path", "transformers_version"}
CHAT = [{"role": "user", "content": "Hello, how are you today?"},
        {"role": "assistant", "content": "The quick brown fox."}]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from transformers import GenerationConfig

    root = tmp_path_factory.mktemp("hf_files")
    source = root / "source"
    model = build_hf_model("llama", pad_token_id=PAD_TOKEN_ID)
    model.generation_config = GenerationConfig(**GENERATION)
    model.save_pretrained(source)
    save_tokenizer("llama3", source)
    out = root / "export"
    run_distributed(rank_import_export, 1, args=(model_argv(source), str(out)), timeout_s=120)
    return source, out


def _without_provenance(values: dict) -> dict:
    return {k: v for k, v in values.items() if k not in _PROVENANCE}


def test_generation_config_survives(exported):
    from transformers import GenerationConfig

    source, out = exported
    ours = GenerationConfig.from_pretrained(out).to_dict()
    assert _without_provenance(ours) == _without_provenance(
        GenerationConfig.from_pretrained(source).to_dict())
    assert ours["do_sample"] and ours["temperature"] == GENERATION["temperature"]


def test_config_fields_survive(exported):
    from transformers import AutoConfig

    source, out = exported
    theirs = AutoConfig.from_pretrained(source).to_dict()
    ours = AutoConfig.from_pretrained(out).to_dict()
    differ = {k: (v, ours.get(k, "<absent>")) for k, v in _without_provenance(theirs).items()
              if ours.get(k, "<absent>") != v}
    assert differ == {}
    assert json.loads((out / "config.json").read_text())["pad_token_id"] == PAD_TOKEN_ID


def test_export_into_the_source_directory_keeps_its_generation_config(tmp_path):
    """Over its own source (nothing trained): the files are what they were, the generation
    config included (it is read before anything is written)."""
    from transformers import GenerationConfig

    source = tmp_path / "source"
    model = build_hf_model("qwen3")
    model.generation_config = GenerationConfig(**GENERATION)
    model.save_pretrained(source)
    before = (source / "generation_config.json").read_text()
    weights = (source / "model.safetensors").read_bytes()
    run_distributed(rank_import_export, 1, args=(model_argv(source), str(source)), timeout_s=120)
    assert (source / "generation_config.json").read_text() == before
    from safetensors.torch import load

    ours, theirs = load((source / "model.safetensors").read_bytes()), load(weights)
    assert sorted(ours) == sorted(theirs) and all(
        torch.equal(ours[k], theirs[k]) for k in theirs)


def test_tokenizer_of_the_checkpoint_comes_along(exported):
    from transformers import AutoTokenizer

    source, out = exported
    theirs, ours = AutoTokenizer.from_pretrained(source), AutoTokenizer.from_pretrained(out)
    text = "Packing puts many short samples into one sequence."
    assert ours(text)["input_ids"] == theirs(text)["input_ids"]
    assert ours.apply_chat_template(CHAT, tokenize=False) == \
        theirs.apply_chat_template(CHAT, tokenize=False)
    assert (ours.eos_token, ours.bos_token) == (theirs.eos_token, theirs.bos_token)


def test_export_tool_takes_the_vocabulary_from_the_tokenizer(tmp_path):
    """A model trained from scratch whose vocabulary is the tokenizer's (no --vocab-size, no
    --hf-checkpoint): tools/export_hf.py resolves it as training did (it crashed on a None
    vocabulary) and writes what --save-hf wrote at the end of the same run, with the
    tokenizer's special ids where transformers' generate looks for them (none were written, so
    generation never stopped at the end of a turn)."""
    import subprocess
    import sys

    from tests.unit_tests.varlen_training.hf.ranks import rank_train
    from tests.unit_tests.varlen_training.hf.test_hf_export_layouts import REPO, _load
    from tests.unit_tests.varlen_training.hf.test_hf_mtp import LLAMA_SHAPE
    from tests.unit_tests.varlen_training.hf.tiny_models import TOKENIZER_VOCAB

    tokenizer = save_tokenizer("chatml", tmp_path / "tokenizer")
    model = LLAMA_SHAPE + ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                           tokenizer]
    training = ["--seq-length", "16", "--mock-data", "--micro-batch-size", "2",
                "--global-batch-size", "2", "--train-iters", "1", "--lr", "1e-2",
                "--eval-iters", "0"]
    run_distributed(rank_train, 1, args=({"scratch": model + training + [
        "--save", str(tmp_path / "ckpt"), "--save-hf", str(tmp_path / "save_hf")]},),
        timeout_s=120)
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "export_hf.py"), "--load", str(tmp_path / "ckpt"),
         "--save-hf", str(tmp_path / "tool"), *model],
        capture_output=True, text=True, timeout=240, cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    ours, saved = _load(tmp_path / "tool"), _load(tmp_path / "save_hf")
    assert sorted(ours) == sorted(saved)
    assert [k for k in saved if not torch.equal(ours[k], saved[k])] == []
    assert json.loads((tmp_path / "tool" / "config.json").read_text())["vocab_size"] == \
        TOKENIZER_VOCAB
    assert (tmp_path / "tool" / "tokenizer.json").is_file()
    from transformers import AutoTokenizer, GenerationConfig

    reference = AutoTokenizer.from_pretrained(tokenizer)
    assert (tmp_path / "tool" / "generation_config.json").is_file()
    generation = GenerationConfig.from_pretrained(tmp_path / "tool")
    assert (generation.eos_token_id, generation.pad_token_id) == (reference.eos_token_id,
                                                                 reference.pad_token_id)
    assert reference.eos_token_id is not None


def test_export_without_a_tokenizer_removes_an_earlier_exports(exported, tmp_path):
    """An export of a model with no Hugging Face tokenizer (NullTokenizer, trained from scratch)
    into a directory that holds an earlier export's tokenizer: those files go. Left there,
    transformers loaded them with this model, whose ids are not that tokenizer's."""
    import shutil

    from transformers import AutoTokenizer

    from tests.unit_tests.varlen_training.hf.test_hf_mtp import ARCHITECTURE, TRAINING

    _, earlier = exported
    out = tmp_path / "export"
    shutil.copytree(earlier, out)
    assert (out / "tokenizer.json").is_file()  # the earlier export's
    run_distributed(rank_import_export, 1, args=(ARCHITECTURE + TRAINING, str(out)),
                    timeout_s=120)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    with pytest.raises((OSError, ValueError)):
        AutoTokenizer.from_pretrained(out)
