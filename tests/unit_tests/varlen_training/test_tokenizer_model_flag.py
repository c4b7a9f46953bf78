"""``--tokenizer-model`` is read by ``--tokenizer-type HuggingFaceTokenizer`` (and the
SentencePiece / TikToken types: test_model_file_tokenizers.py) only: beside
NullTokenizer or ByteLevelTokenizer it used to be ignored without a word (the run trained on
that type's ids). Now it is one line naming both flags, exit code 2, in the flag layer of
pretrain_gpt.py and pretrain_mamba.py and in tools/preprocess_data.py (the facade:
tests/unit_tests/wrap/test_wrap_tokenizer_model.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from megatron.varlen_training.arguments import ArgumentValidationError, parse_args
from tests.harness.training_runs import TINY_GPT_ARGS
from tools.preprocess_data import main as preprocess_main

IGNORING_TYPES = ("NullTokenizer", "ByteLevelTokenizer")  # ids from the text or the bytes
REPO = Path(__file__).resolve().parents[3]
ENTRY_POINT_TIMEOUT_S = 120


def _parse(*flags: str):
    return parse_args(TINY_GPT_ARGS + ["--train-iters", "1", *flags], world_size=1)


@pytest.mark.parametrize("kind", IGNORING_TYPES)
def test_tokenizer_model_beside_a_type_that_ignores_it_is_one_line(kind):
    with pytest.raises(ArgumentValidationError) as err:
        _parse("--tokenizer-type", kind, "--tokenizer-model", "models/tok")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("--tokenizer-model 'models/tok' is read by --tokenizer-type "
                              "HuggingFaceTokenizer, the SentencePiece types and TikTokenizer "
                              f"only, but --tokenizer-type is {kind}")
    assert "drop --tokenizer-model" in message


@pytest.mark.parametrize("kind", IGNORING_TYPES)
def test_the_types_without_tokenizer_model_still_parse(kind):
    assert _parse("--tokenizer-type", kind).tokenizer_model is None


def test_hugging_face_tokenizer_keeps_its_tokenizer_model(tmp_path):
    args = _parse("--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(tmp_path))
    assert args.tokenizer_model == str(tmp_path)


def test_preprocess_data_refuses_it_in_one_line(tmp_path, capsys):
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text('{"text": "hello"}\n', encoding="utf-8")
    code = preprocess_main(["--input", str(corpus), "--tokenizer-type", "ByteLevelTokenizer",
                            "--tokenizer-model", "models/tok", "--output-prefix",
                            str(tmp_path / "out"), "--workers", "1"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert "--tokenizer-model 'models/tok'" in lines[0]
    assert "--tokenizer-type is ByteLevelTokenizer" in lines[0]
    assert not list(tmp_path.glob("out_*")), "output written despite the refusal"


def test_pretrain_mamba_refuses_it_alike():
    from megatron.varlen_training.hybrid_arguments import parse_hybrid_args

    hybrid = ["--hybrid-override-pattern", "M*", "--mamba-head-dim", "8",
              "--mamba-num-groups", "2", "--train-iters", "1"]
    with pytest.raises(ArgumentValidationError, match="^--tokenizer-model 'models/tok' is read"):
        parse_hybrid_args(TINY_GPT_ARGS + hybrid + ["--tokenizer-model", "models/tok"],
                          world_size=1)


def test_pretrain_gpt_exits_2_with_one_line():
    result = subprocess.run(
        [sys.executable, "pretrain_gpt.py", *TINY_GPT_ARGS, "--train-iters", "1",
         "--tokenizer-type", "ByteLevelTokenizer", "--tokenizer-model", "models/tok"],
        cwd=REPO, capture_output=True, text=True, timeout=ENTRY_POINT_TIMEOUT_S)
    lines = [line for line in result.stderr.splitlines() if "--tokenizer-model" in line]
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "--tokenizer-type is ByteLevelTokenizer" in lines[0]
