"""tools/preprocess_data.py: text -> .bin/.idx -> ids -> text is exact for the byte-level
tokenizer, --workers 2 writes the same bytes as --workers 1, Hugging Face tokenizers give their
own ids, the output trains, and a bad line is one line naming file:line (exit code 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from megatron.core.datasets.indexed_dataset import IndexedDataset

from tests.harness.extras import needs_extra
from tools.preprocess_data import main
from megatron.varlen_training.tokenizer import BYTE_EOD

REPO = Path(__file__).resolve().parents[3]
TEXTS = [
    "Hello, world.",
    "",  # no tokens: an empty document (no sequence; test_preprocess_megatron_parity.py)
    "caf\u00e9 \u00fcber na\u00efve \u2014 \u6f22\u5b57 \U0001F600\n\ttabs and\r\nnewlines",
    "x",
    "a much longer document " * 40,
    "\u0000 NUL and \u00ff",
]


def _write_jsonl(path: Path, records: list[dict], blank_lines: bool = True) -> Path:
    lines = [json.dumps(record) for record in records]
    if blank_lines:
        lines.insert(1, "")  # blank lines are skipped
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _run(*argv: str) -> int:
    return main(list(argv))


def _documents(prefix: str) -> list[np.ndarray]:
    dataset = IndexedDataset(prefix)  # megatron-core's reader, not ours
    # copies: the arrays are views of its memory map, closed when the reader is collected
    return [np.array(dataset[i]) for i in range(len(dataset))]


@pytest.fixture
def corpus(tmp_path):
    return _write_jsonl(tmp_path / "docs.jsonl", [{"text": t, "id": i} for i, t in
                                                  enumerate(TEXTS)])


def test_byte_level_round_trip_is_exact(corpus, tmp_path):
    assert _run("--input", str(corpus), "--tokenizer-type", "ByteLevelTokenizer",
                "--append-eod", "--output-prefix", str(tmp_path / "out"), "--workers", "1") == 0
    documents = _documents(str(tmp_path / "out_text_document"))
    expected = [text for text in TEXTS if text]
    assert len(documents) == len(expected)
    for ids, text in zip(documents, expected):
        assert ids.dtype == np.uint16 and ids[-1] == BYTE_EOD
        assert bytes(ids[:-1].tolist()).decode("utf-8") == text


@pytest.mark.parametrize("tokenizer", [
    "ByteLevelTokenizer", pytest.param("HuggingFaceTokenizer", marks=needs_extra("hf"))])
def test_two_workers_write_the_same_files(tmp_path, tokenizer):
    records = [{"text": f"document {i} " + "word " * (i % 17)} for i in range(300)]
    corpus = _write_jsonl(tmp_path / "many.jsonl", records)
    extra = []
    if tokenizer == "HuggingFaceTokenizer":
        from tests.unit_tests.varlen_training.hf.tiny_models import save_tokenizer
        extra = ["--tokenizer-model", save_tokenizer("chatml", str(tmp_path / "tok"))]
    for workers in ("1", "2"):
        assert _run("--input", str(corpus), "--tokenizer-type", tokenizer, *extra,
                    "--append-eod", "--output-prefix", str(tmp_path / f"w{workers}"),
                    "--workers", workers, "--log-interval", "100") == 0
    for suffix in (".bin", ".idx"):
        one = (tmp_path / f"w1_text_document{suffix}").read_bytes()
        two = (tmp_path / f"w2_text_document{suffix}").read_bytes()
        assert one == two and len(one) > 0


@needs_extra("hf")
def test_hugging_face_ids_are_the_tokenizers_own(corpus, tmp_path):
    from transformers import AutoTokenizer

    from tests.unit_tests.varlen_training.hf.tiny_models import save_tokenizer

    model = save_tokenizer("chatml", str(tmp_path / "tok"))
    assert _run("--input", str(corpus), "--tokenizer-type", "HuggingFaceTokenizer",
                "--tokenizer-model", model, "--append-eod", "--output-prefix",
                str(tmp_path / "hf"), "--workers", "2") == 0
    reference = AutoTokenizer.from_pretrained(model, local_files_only=True)
    # megatron-core's HuggingFaceTokenizer.text_to_ids (Megatron-LM's default): the
    # tokenizer's own call, special tokens included (this one adds none)
    expected = [reference(t).input_ids + [reference.eos_token_id] for t in TEXTS if t]
    assert [d.tolist() for d in _documents(str(tmp_path / "hf_text_document"))] == expected


def test_each_json_key_gets_its_dataset(tmp_path):
    corpus = _write_jsonl(tmp_path / "kv.jsonl", [{"title": "T1", "body": "first"},
                                                  {"title": "T2", "body": "second"}])
    assert _run("--input", str(corpus), "--json-keys", "title", "body", "--tokenizer-type",
                "ByteLevelTokenizer", "--output-prefix", str(tmp_path / "kv"),
                "--workers", "1") == 0
    as_text = lambda prefix: [bytes(d.tolist()).decode() for d in _documents(prefix)]  # noqa
    assert as_text(str(tmp_path / "kv_title_document")) == ["T1", "T2"]
    assert as_text(str(tmp_path / "kv_body_document")) == ["first", "second"]


@pytest.mark.parametrize("line, needle", [
    ('{"text": bad}', "invalid JSON: Expecting value (column 10)"),
    ('{"other": "x"}', "no key 'text' (--json-keys text); the object's keys are ['other']"),
    ('{"text": 3}', "'text' is a int, not a string or a list of strings (sentences)"),
    ('{"text": ["a", 3]}', "'text' is a list holding a int, not a string or a list of strings "
                           "(sentences)"),
    ('[1, 2]', "expected a JSON object, got list"),
])
def test_bad_line_names_file_and_line_and_leaves_no_output(tmp_path, capsys, line, needle):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "fine"}\n\n' + line + "\n", encoding="utf-8")
    code = _run("--input", str(path), "--tokenizer-type", "ByteLevelTokenizer",
                "--output-prefix", str(tmp_path / "bad"), "--workers", "2")
    assert code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"preprocess_data.py: error: {path}:3: {needle}"]
    assert not list(tmp_path.glob("bad_text_document.*")), "partial output left behind"


def test_bad_utf8_names_the_line(tmp_path, capsys):
    path = tmp_path / "bytes.jsonl"
    path.write_bytes(b'{"text": "ok"}\n{"text": "\xff"}\n')
    assert _run("--input", str(path), "--tokenizer-type", "ByteLevelTokenizer",
                "--output-prefix", str(tmp_path / "b"), "--workers", "1") == 2
    assert capsys.readouterr().err.strip() == (
        f"preprocess_data.py: error: {path}:2: not valid UTF-8 (byte 0xff at byte offset 10 of "
        f"the line)")


def test_script_from_the_repo_root(corpus, tmp_path):
    """The real command line: exit 0, Megatron-LM's progress line (one document per JSON
    record), and the prefix it prints names the dataset megatron-core reads."""
    proc = subprocess.run(
        [sys.executable, "tools/preprocess_data.py", "--input", str(corpus), "--tokenizer-type",
         "ByteLevelTokenizer", "--append-eod", "--output-prefix", str(tmp_path / "cli"),
         "--workers", "2"],
        cwd=REPO, capture_output=True, text=True, timeout=240,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("Processed 6 documents (")
    prefix = str(tmp_path / "cli_text_document")
    assert f"train with --data-path {prefix}" in proc.stdout
    assert len(_documents(prefix)) == 5


def test_byte_order_mark_and_crlf_lines_give_the_plain_files(corpus, tmp_path):
    """A file saved with a UTF-8 byte order mark and Windows line ends (CRLF) holds the same
    documents as the plain file: the mark is no part of the first text, and JSON ignores the
    CR."""
    plain = corpus.read_bytes()
    windows = tmp_path / "windows.jsonl"
    windows.write_bytes(b"\xef\xbb\xbf" + plain.replace(b"\n", b"\r\n"))
    for name, path in (("plain", corpus), ("windows", windows)):
        assert _run("--input", str(path), "--tokenizer-type", "ByteLevelTokenizer",
                    "--append-eod", "--output-prefix", str(tmp_path / name),
                    "--workers", "1") == 0
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"windows_text_document{suffix}").read_bytes() == \
            (tmp_path / f"plain_text_document{suffix}").read_bytes()
