"""tools/preprocess_data.py writes the .bin/.idx Megatron-LM's tools/preprocess_data.py writes
for the same flags, byte for byte.

The reference is built here, independently of the tool: the ids from the tokenizer called
directly (transformers' ``tokenizer(text).input_ids``, megatron-core's HuggingFaceTokenizer
default; or its tokens converted to ids under --tokenizer-hf-no-include-special-tokens; bytes
for ByteLevelTokenizer), assembled by Megatron-LM's rules (its ``Encoder.encode``: a list value
is sentences, each sentence with tokens one sequence, eod appended to the last; a text without
tokens an empty document; --partitions N deals lines to partitions in turn and merges them in
partition order) and written by megatron-core's ``IndexedDatasetBuilder``; megatron-core's
``IndexedDataset`` reads both. Megatron-LM's flags the tool does not do are one line, exit 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from megatron.core.datasets.indexed_dataset import DType, IndexedDataset, IndexedDatasetBuilder

from tests.harness.extras import needs_extra
from tools.preprocess_data import main
from megatron.varlen_training.tokenizer import BYTE_EOD, BYTE_VOCAB_SIZE

RECORDS = [
    {"text": "Hello, world."},
    {"text": ""},  # no tokens: an empty document (a BOS where the tokenizer adds one)
    {"text": ["First sentence.", "", "Second one, after an empty sentence."]},
    {"text": "caf\u00e9 \u00fcber \u2014 \U0001F600"},
    {"text": []},  # no sentences: an empty document
    {"text": "x"},
    {"text": "The quick brown fox jumps over the lazy dog. " * 3},
]


def _write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _reference_files(prefix: Path, records: list[dict], ids_of, eod: int | None,
                     vocab_size: int, partitions: int = 1) -> Path:
    """Megatron-LM's output for ``records``: ``ids_of(text)`` per sentence, ``eod`` appended
    (None: no --append-eod), lines dealt round-robin to ``partitions`` and merged in order."""
    order = [i for p in range(partitions) for i in range(p, len(records), partitions)]
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=DType.optimal_dtype(vocab_size))
    for index in order:
        value = records[index]["text"]
        sentences = value if isinstance(value, list) else [value]
        ids, lengths = [], []
        for sentence in sentences:
            sentence_ids = list(ids_of(sentence))
            if sentence_ids:
                ids += sentence_ids
                lengths.append(len(sentence_ids))
        if ids and eod is not None:
            ids.append(eod)
            lengths[-1] += 1
        builder.add_document(ids, lengths)
    builder.finalize(f"{prefix}.idx")
    return prefix


def _assert_same_files(ours: Path, reference: Path) -> None:
    for suffix in (".bin", ".idx"):
        assert Path(f"{ours}{suffix}").read_bytes() == Path(f"{reference}{suffix}").read_bytes(), \
            suffix
    mine, theirs = IndexedDataset(str(ours)), IndexedDataset(str(reference))
    assert np.array_equal(mine.document_indices, theirs.document_indices)
    assert np.array_equal(mine.sequence_lengths, theirs.sequence_lengths)
    assert [np.array(mine[i]).tolist() for i in range(len(mine))] == \
        [np.array(theirs[i]).tolist() for i in range(len(theirs))]


def _run(corpus: Path, prefix: Path, *flags: str) -> Path:
    assert main(["--input", str(corpus), "--output-prefix", str(prefix), *flags]) == 0
    return Path(f"{prefix}_text_document")


def _bytes_of(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def test_empty_texts_and_sentence_lists_as_megatron_lm(tmp_path):
    corpus = _write_jsonl(tmp_path / "docs.jsonl", RECORDS)
    ours = _run(corpus, tmp_path / "ours", "--tokenizer-type", "ByteLevelTokenizer",
                "--append-eod", "--workers", "2")
    reference = _reference_files(tmp_path / "reference", RECORDS, _bytes_of, BYTE_EOD,
                                 BYTE_VOCAB_SIZE)
    _assert_same_files(ours, reference)
    dataset = IndexedDataset(str(ours))  # by counting: every record is a document ...
    assert len(dataset.document_indices) == len(RECORDS) + 1
    # ... the two without tokens have no sequence, the 2 sentences with tokens of record 2
    # (after record 0's sequence) one each
    assert len(dataset) == len(RECORDS) - 2 + 1
    assert dataset.document_indices[:4].tolist() == [0, 1, 1, 3]
    assert dataset.sequence_lengths[1:3].tolist() == [len("First sentence."),
                                                      len("Second one, after an empty "
                                                          "sentence.") + 1]


@pytest.mark.parametrize("partitions, sequential", [(3, False), (3, True), (2, False)])
def test_partitions_order_as_megatron_lm(tmp_path, partitions, sequential):
    records = [{"text": f"document {i} " + "w" * (i % 4)} for i in range(11)]
    corpus = _write_jsonl(tmp_path / "docs.jsonl", records)
    ours = _run(corpus, tmp_path / "ours", "--tokenizer-type", "ByteLevelTokenizer",
                "--append-eod", "--workers", str(partitions), "--partitions", str(partitions),
                *(["--keep-sequential-samples"] if sequential else []))
    reference = _reference_files(tmp_path / "reference", records, _bytes_of, BYTE_EOD,
                                 BYTE_VOCAB_SIZE, 1 if sequential else partitions)
    _assert_same_files(ours, reference)


def test_null_tokenizer_as_megatron_lm(tmp_path):
    """NullTokenizer: ids written as text, eod = --vocab-size - 1, as Megatron-LM's since
    April 2026 (megatron-core 0.16.1's put eod at --vocab-size, one past); its text_to_ids
    splits on single spaces (an empty text is an error there, so none is read here)."""
    vocab_size = 70_000  # int32 ids: past uint16's range
    records = [{"text": "5 17 3"}, {"text": ["1 2", "69998"]}, {"text": "0"}]
    corpus = _write_jsonl(tmp_path / "ids.jsonl", records)
    ours = _run(corpus, tmp_path / "ours", "--tokenizer-type", "NullTokenizer", "--vocab-size",
                str(vocab_size), "--append-eod", "--workers", "1")
    reference = _reference_files(tmp_path / "reference", records,
                                 lambda text: [int(x) for x in text.split(" ")],
                                 vocab_size - 1, vocab_size)
    _assert_same_files(ours, reference)
    assert IndexedDataset(str(ours))[0].dtype == np.int32


def _bos_tokenizer(folder: Path) -> str:
    """The tests' tiny Llama-3-style tokenizer with a post-processor that adds its BOS, as
    Llama tokenizers do: ``tokenizer(text)`` and ``encode(text)`` start with it."""
    from tokenizers import processors
    from transformers import AutoTokenizer

    from tests.unit_tests.varlen_training.hf.tiny_models import save_tokenizer

    path = save_tokenizer("llama3", str(folder))
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    bos = tokenizer.bos_token
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
        special_tokens=[(bos, tokenizer.bos_token_id)])
    tokenizer.save_pretrained(path)
    return path


@needs_extra("hf")
@pytest.mark.parametrize("special_tokens, flags", [
    (True, []),
    (True, ["--tokenizer-hf-include-special-tokens"]),  # Megatron-LM's older flag: the default
    (False, ["--tokenizer-hf-no-include-special-tokens"]),
], ids=["default", "older_flag", "no_special_tokens"])
def test_hugging_face_ids_as_megatron_lm(tmp_path, special_tokens, flags):
    from transformers import AutoTokenizer

    model = _bos_tokenizer(tmp_path / "tok")
    reference = AutoTokenizer.from_pretrained(model, local_files_only=True)
    if special_tokens:  # megatron-core's HuggingFaceTokenizer.text_to_ids, its default
        ids_of = lambda text: reference(text).input_ids  # noqa: E731
        assert ids_of("x")[0] == reference.bos_token_id  # the reference does add a BOS
    else:
        ids_of = lambda text: reference.convert_tokens_to_ids(reference.tokenize(text))  # noqa
        assert reference.bos_token_id not in ids_of("x")
    corpus = _write_jsonl(tmp_path / "docs.jsonl", RECORDS)
    ours = _run(corpus, tmp_path / "ours", "--tokenizer-type", "HuggingFaceTokenizer",
                "--tokenizer-model", model, "--append-eod", "--workers", "1", *flags)
    expected = _reference_files(tmp_path / "reference", RECORDS, ids_of,
                                reference.eos_token_id, len(reference))
    _assert_same_files(ours, expected)


@pytest.mark.parametrize("flags, needle", [
    (["--split-sentences"], "--split-sentences is not supported: nltk sentence splitting is "),
    (["--keep-newlines"], "--keep-newlines is not supported: it only applies to --split-sent"),
    (["--lang", "german"], "--lang german is not supported: it only applies to --split-sent"),
    (["--find-optimal-num-workers"], "--find-optimal-num-workers is not supported: the worker "),
    (["--workers-to-check", "4", "8"], "--workers-to-check 4 8 is not supported: it only "),
    (["--max-documents", "10"], "--max-documents 10 is not supported: it only applies to "),
    (["--partitions", "2"], "--workers 1 must be a multiple of --partitions 2 (>= 1), as in "
                            "Megatron-LM"),
])
def test_megatron_lm_flags_not_done_are_one_line(tmp_path, capsys, flags, needle):
    corpus = _write_jsonl(tmp_path / "docs.jsonl", RECORDS[:1])
    code = main(["--input", str(corpus), "--output-prefix", str(tmp_path / "out"),
                 "--tokenizer-type", "ByteLevelTokenizer", "--workers", "1", *flags])
    assert code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("preprocess_data.py: error: ") and \
        needle in lines[0], lines
    assert not list(tmp_path.glob("out_*")), "output written although refused"
