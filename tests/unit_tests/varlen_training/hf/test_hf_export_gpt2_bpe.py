"""--save-hf / tools/export_hf.py of a GPT2BPETokenizer run: the exported directory carries a
Hugging Face GPT-2 tokenizer that transformers loads with the ids training read (checked against
the independent GPT-2 BPE of gpt2_files.py), and config.json's bos/eos ids are the eod."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.hf.exporter import export_config
from megatron.varlen_training.megatron_lm_tokenizers import save_gpt2_bpe
from tests.harness.extras import needs_extra
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import TINY_GPT_ARGS

regex = pytest.importorskip("regex")  # the reference's pre-tokenizer (a transformers dependency)
from tests.unit_tests.varlen_training.gpt2_files import (  # noqa: E402
    EOD_TOKEN, reference_ids, vocabulary, write_gpt2_files,
)

pytestmark = needs_extra("hf")
TEXTS = ["hello world", f"the cafe caf\u00e9{EOD_TOKEN} 12\n\n  in a", ""]
# what config_from_model needs for a Llama-style export
EXPORTABLE = ["--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear",
              "--position-embedding-type", "rope", "--train-iters", "1"]


def _run(folder: Path):
    vocab_file, merge_file = write_gpt2_files(folder)
    at = TINY_GPT_ARGS.index("--vocab-size")
    argv = TINY_GPT_ARGS[:at] + TINY_GPT_ARGS[at + 2:] + EXPORTABLE + [
        "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", str(vocab_file),
        "--merge-file", str(merge_file)]
    return parse_run_config(argv, world_size=1).with_vocabulary(len(vocabulary()))


def _assert_loads_as_gpt2(out_dir: Path) -> None:
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(str(out_dir), local_files_only=True)
    assert [loaded.encode(t, add_special_tokens=False) for t in TEXTS] == \
        [reference_ids(t) for t in TEXTS]
    assert loaded.eos_token_id == vocabulary()[EOD_TOKEN] and len(loaded) == len(vocabulary())
    config = json.loads((out_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["tokenizer_class"] == "GPT2Tokenizer"


def test_saved_directory_loads_with_the_training_ids(tmp_path):
    vocab_file, merge_file = write_gpt2_files(tmp_path / "files")
    save_gpt2_bpe(str(vocab_file), str(merge_file), str(tmp_path / "out"))
    _assert_loads_as_gpt2(tmp_path / "out")
    assert json.loads((tmp_path / "out" / "vocab.json").read_text()) == vocabulary()


def test_config_token_ids_are_the_eod(tmp_path):
    config = export_config(_run(tmp_path))
    eod = vocabulary()[EOD_TOKEN]
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (eod, eod, None)


def export_tokenizer_on_this_rank(folder: str, out_dir: str) -> list[str]:
    from megatron.varlen_training.hf.exporter import _export_tokenizer_on_rank_0

    _export_tokenizer_on_rank_0(_run(Path(folder)), out_dir)
    return sorted(p.name for p in Path(out_dir).iterdir())


def test_export_writes_it_beside_the_model_and_drops_a_stale_tokenizer(tmp_path):
    out = tmp_path / "export"
    out.mkdir()
    (out / "special_tokens_map.json").write_text("{}")  # an earlier export's tokenizer file
    (out / "config.json").write_text("{}")  # the model's own files stay
    [names] = run_distributed(export_tokenizer_on_this_rank, 1,
                              args=(str(tmp_path / "files"), str(out)), timeout_s=120)
    assert names == ["config.json", "merges.txt", "tokenizer.json", "tokenizer_config.json",
                     "vocab.json"]
    _assert_loads_as_gpt2(out)


def export_tool_vocabulary_on_this_rank(folder: str) -> tuple[int, int]:
    from megatron.varlen_training.hf.export_tool import with_tokenizer_vocabulary

    run = _run(Path(folder))  # the vocabulary unresolved, as the flags leave it
    run = dataclasses.replace(run, model=dataclasses.replace(run.model, vocab_size=None))
    model = with_tokenizer_vocabulary(run).model
    return model.vocab_size, model.padded_vocab_size


def test_export_tool_sizes_the_vocabulary_from_the_files(tmp_path):
    """tools/export_hf.py resolves the vocabulary as training did: from --vocab-file."""
    [(vocab, padded)] = run_distributed(export_tool_vocabulary_on_this_rank, 1,
                                        args=(str(tmp_path / "files"),), timeout_s=120)
    divisible_by = int(TINY_GPT_ARGS[TINY_GPT_ARGS.index("--make-vocab-size-divisible-by") + 1])
    assert vocab == len(vocabulary())
    assert padded == -(-vocab // divisible_by) * divisible_by
