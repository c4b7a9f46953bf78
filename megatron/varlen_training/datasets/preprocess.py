"""JSONL text -> Megatron indexed datasets (.bin/.idx), the work of tools/preprocess_data.py.

The files are the ones Megatron-LM's tools/preprocess_data.py writes for the same flags (its
``Encoder.encode``; tested byte for byte against megatron-core's builder fed by transformers):
each non-blank line of ``--input`` is a JSON object; for every ``--json-keys`` key its string
is tokenized with the training layer's tokenizer (``--tokenizer-type``, as pretrain_gpt.py
builds it, so the ids are the ones training reads; a Hugging Face tokenizer as megatron-core
calls it, special tokens such as a BOS included unless ``--tokenizer-hf-no-include-special-
tokens``), plus the eod id with ``--append-eod``, and written as one document by megatron-core's
``IndexedDatasetBuilder`` to ``{--output-prefix}_{key}_document.bin/.idx`` (Megatron-LM's
names; pass that prefix to ``--data-path``). A list of strings is a document of pre-split
sentences: each sentence with tokens is one sequence of the document, eod ends the last. A
text with no tokens is an empty document (no sequence, no eod: Megatron-LM's), counted. Token
ids are stored as megatron-core's ``DType.optimal_dtype`` of the vocabulary (uint16 below
65500 ids, else int32). ``--partitions N`` writes the documents in Megatron-LM's partition
order (line ``i`` goes to partition ``i mod N``, the partitions are concatenated), unless
``--keep-sequential-samples`` keeps the input order.

``--workers N`` tokenizes in N processes; lines are written in input order whatever the number
of workers, so the files are byte-identical to ``--workers 1``'s. A bad line (invalid JSON or
UTF-8, a missing key, a value that is not a string) stops the run in one line naming
``file:line``, and the partly written outputs are removed.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
from dataclasses import dataclass

import numpy as np
from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

from megatron.varlen_training.datasets.jsonl_lines import decode_line
from megatron.varlen_training.model_file_tokenizers import ModelFileOptions
from megatron.varlen_training.tokenizer import HuggingFaceTokenizer, Tokenizer, build_tokenizer

DOCUMENT_LEVEL = "document"  # Megatron-LM's suffix without --split-sentences
CHUNK_LINES = 64  # lines a worker tokenizes per task: few round trips, little reordering
BYTES_PER_MB = 1024 * 1024
PROGRESS_MIN_INTERVAL_S = 0.5


@dataclass(frozen=True)
class PreprocessConfig:
    """tools/preprocess_data.py's flags (Megatron-LM's names).

    Attributes:
        input: The JSONL file.
        json_keys: Keys whose text becomes documents, one output dataset per key.
        tokenizer_type: ``--tokenizer-type`` of the training layer (tokenizer.py).
        tokenizer_model: Local tokenizer directory (HuggingFaceTokenizer).
        vocab_size: ``--vocab-size`` (NullTokenizer).
        append_eod: Append the tokenizer's eod id to every document.
        output_prefix: Outputs are ``{output_prefix}_{key}_document.bin/.idx``.
        workers: Tokenizing processes.
        log_interval: Print Megatron-LM's progress line every this many documents.
        include_special_tokens: A Hugging Face tokenizer adds its special tokens (a BOS) as
            ``tokenizer(text)`` does (not ``--tokenizer-hf-no-include-special-tokens``).
        partitions: ``--partitions``: the documents in Megatron-LM's partition order.
        keep_sequential_samples: Partitions of consecutive lines (the input order).
        vocab_file: GPT-2's vocabulary JSON (GPT2BPETokenizer's ``--vocab-file``).
        merge_file: GPT-2's merges (GPT2BPETokenizer's ``--merge-file``).
        model_file_options: the SentencePiece types' and TikTokenizer's flags besides
            ``--tokenizer-model``.
    """

    input: str
    json_keys: tuple[str, ...]
    tokenizer_type: str
    output_prefix: str
    tokenizer_model: str | None = None
    vocab_size: int | None = None
    append_eod: bool = False
    workers: int = 1
    log_interval: int = 1000
    include_special_tokens: bool = True
    partitions: int = 1
    keep_sequential_samples: bool = False
    vocab_file: str | None = None
    merge_file: str | None = None
    model_file_options: ModelFileOptions = ModelFileOptions()

    def build_tokenizer(self) -> Tokenizer:
        """The tokenizer these flags name, as the training layer builds it."""
        return build_tokenizer(self.tokenizer_type, self.vocab_size, self.tokenizer_model,
                               self.vocab_file, self.merge_file, self.model_file_options)

    @property
    def round_robin(self) -> bool:
        """Whether lines are dealt to the partitions in turn (the documents reordered)."""
        return self.partitions > 1 and not self.keep_sequential_samples

    def output_prefixes(self) -> dict[str, str]:
        """Each key's dataset prefix (what ``--data-path`` takes)."""
        return {key: f"{self.output_prefix}_{key}_{DOCUMENT_LEVEL}" for key in self.json_keys}


@dataclass(frozen=True)
class PreprocessSummary:
    """What a run wrote: documents and tokens per key, texts without tokens, the input's
    JSON records (its non-blank lines) and bytes read, time taken."""

    prefixes: dict[str, str]
    documents: dict[str, int]
    tokens: dict[str, int]
    empty: int
    lines: int
    read_bytes: int
    seconds: float

    def progress_line(self) -> str:
        """Megatron-LM's progress line for the whole run."""
        return progress_line(self.lines, self.seconds, self.read_bytes)


@dataclass(frozen=True)
class Document:
    """One key's document: its ids and its sequences' lengths (one per sentence with tokens;
    eod counts to the last); no ids: an empty document."""

    ids: np.ndarray
    lengths: list[int]


class LineEncoder:
    """Tokenizes one JSONL line; built once per worker process (the tokenizer with it)."""

    def __init__(self, config: PreprocessConfig):
        self.config = config
        self.tokenizer: Tokenizer = config.build_tokenizer()

    def encode(self, line_number: int, raw: bytes) -> dict[str, Document] | None:
        """``{key: document}`` of the line, None for a blank line.

        Raises:
            ValueError: one line naming ``file:line`` and what is wrong.
        """
        where = f"{self.config.input}:{line_number}"
        text = decode_line(where, line_number, raw)
        if not text.strip():
            return None
        record = _parse_json(where, text)
        return {key: self._document(where, record, key) for key in self.config.json_keys}

    def _document(self, where: str, record: dict, key: str) -> Document:
        """Megatron-LM's ``Encoder.encode`` of one key: a string is one sentence, a list of
        strings its sentences; sentences without tokens are dropped, eod ends the last."""
        ids, lengths = [], []
        for sentence in _sentences(where, record, key, self.config.json_keys):
            sentence_ids = self._text_ids(where, sentence)
            if sentence_ids:
                ids.extend(sentence_ids)
                lengths.append(len(sentence_ids))
        if ids and self.config.append_eod:
            ids.append(self.tokenizer.eod)
            lengths[-1] += 1
        return Document(np.asarray(ids, dtype=np.int64), lengths)

    def _text_ids(self, where: str, text: str) -> list[int]:
        try:
            if isinstance(self.tokenizer, HuggingFaceTokenizer):
                return self.tokenizer.text_to_ids(text, self.config.include_special_tokens)
            return self.tokenizer.tokenize(text)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None


def _sentences(where: str, record: dict, key: str, keys: tuple[str, ...]) -> list[str]:
    if key not in record:
        raise ValueError(f"{where}: no key {key!r} (--json-keys {' '.join(keys)}); the "
                         f"object's keys are {sorted(record)[:8]}")
    value = record[key]
    sentences = value if isinstance(value, list) else [value]
    for sentence in sentences:
        if not isinstance(sentence, str):
            what = (type(value).__name__ if sentence is value
                    else f"list holding a {type(sentence).__name__}")
            raise ValueError(f"{where}: {key!r} is a {what}, not a string or a list of strings "
                             f"(sentences)")
    return sentences


def _parse_json(where: str, text: str) -> dict:
    try:
        record = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: invalid JSON: {err.msg} (column {err.colno})") from None
    except (RecursionError, ValueError) as err:  # nesting too deep, an over-long integer
        raise ValueError(f"{where}: invalid JSON: {type(err).__name__}") from None
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
    return record


_WORKER_ENCODER: LineEncoder | None = None


def _start_worker(config: PreprocessConfig) -> None:
    global _WORKER_ENCODER
    _WORKER_ENCODER = LineEncoder(config)


def _encode_chunk(chunk: list[tuple[int, bytes]]) -> list[tuple[int, dict | None]]:
    return [(len(raw), _WORKER_ENCODER.encode(number, raw)) for number, raw in chunk]


def _numbered_chunks(path: str, every: int = 1, first: int = 0):
    """Lines ``first, first + every, ...`` (0-based) of the input as ``[(line number,
    bytes), ...]`` chunks, in order."""
    chunk = []
    with open(path, "rb") as stream:
        for index, raw in enumerate(stream):
            if index % every != first:
                continue
            chunk.append((index + 1, raw))
            if len(chunk) == CHUNK_LINES:
                yield chunk
                chunk = []
    if chunk:
        yield chunk


def _ordered_chunks(config: PreprocessConfig):
    """The lines in the order their documents are written: the input's, or with round-robin
    ``--partitions N`` Megatron-LM's (partition ``p`` holds lines ``p, p + N, ...``, the merged
    output partition 0's documents, then 1's, ...): one pass over the file per partition."""
    if not config.round_robin:
        yield from _numbered_chunks(config.input)
        return
    for partition in range(config.partitions):
        yield from _numbered_chunks(config.input, config.partitions, partition)


def encoded_lines(config: PreprocessConfig):
    """Every line's ``(bytes, {key: ids})`` (None when blank), in input order, from
    ``config.workers`` processes (in this process for one)."""
    if config.workers == 1:
        encoder = LineEncoder(config)
        for chunk in _ordered_chunks(config):
            yield from ((len(raw), encoder.encode(number, raw)) for number, raw in chunk)
        return
    with multiprocessing.get_context("fork").Pool(config.workers, _start_worker,
                                                  (config,)) as pool:
        for encoded in pool.imap(_encode_chunk, _ordered_chunks(config)):
            yield from encoded


def check_config(config: PreprocessConfig) -> None:
    """Refuses, in one line, what would fail later: no input file, no keys, an output prefix
    whose folder cannot be made, no workers."""
    if not os.path.isfile(config.input):
        what = "is a directory" if os.path.isdir(config.input) else "does not exist"
        raise ValueError(f"--input {config.input!r} {what}; give a JSONL file (one JSON object "
                         f"per line)")
    if not config.json_keys:
        raise ValueError("--json-keys names no key")
    if config.workers < 1:
        raise ValueError(f"--workers must be >= 1 (got {config.workers})")
    if config.log_interval < 1:
        raise ValueError(f"--log-interval must be >= 1 (got {config.log_interval})")
    if config.partitions < 1 or config.workers % config.partitions:
        # Megatron-LM gives each partition workers / partitions processes (and asserts this)
        raise ValueError(f"--workers {config.workers} must be a multiple of --partitions "
                         f"{config.partitions} (>= 1), as in Megatron-LM")
    folder = os.path.dirname(os.path.abspath(config.output_prefix))
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ValueError(f"--output-prefix {config.output_prefix!r}: {folder} is a file, not a "
                         f"directory")


def progress_line(documents: int, elapsed: float, read_bytes: int) -> str:
    """Megatron-LM's progress line."""
    elapsed = max(elapsed, 1e-9)
    return (f"Processed {documents} documents ({documents / elapsed:.2f} docs/s, "
            f"{read_bytes / elapsed / BYTES_PER_MB:.2f} MB/s).")


def preprocess(config: PreprocessConfig, progress=None) -> PreprocessSummary:
    """Writes the datasets (module docstring); ``progress``: a tqdm-like bar to advance per
    line, or None. On any error the outputs written so far are removed.

    Raises:
        ValueError: one line naming the flag or ``file:line``.
    """
    check_config(config)
    tokenizer = config.build_tokenizer()
    dtype = DType.optimal_dtype(tokenizer.vocab_size)
    prefixes = config.output_prefixes()
    os.makedirs(os.path.dirname(os.path.abspath(config.output_prefix)), exist_ok=True)
    builders = {key: IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
                for key, prefix in prefixes.items()}
    try:
        summary = _write(config, builders, prefixes, progress)
    except BaseException:
        _remove_outputs(prefixes)
        raise
    return summary


def _write(config: PreprocessConfig, builders: dict, prefixes: dict[str, str],
           progress) -> PreprocessSummary:
    documents = {key: 0 for key in prefixes}
    tokens = {key: 0 for key in prefixes}
    empty, lines, read_bytes, started = 0, 0, 0, time.perf_counter()
    for size, encoded in encoded_lines(config):
        read_bytes += size
        if encoded is None:  # a blank line
            continue
        lines += 1
        if progress is not None:
            progress.update(1)
        for key, document in encoded.items():
            # no tokens: an empty document all the same (Megatron-LM's document index)
            empty += not len(document.ids)
            builders[key].add_document(document.ids, document.lengths)
            documents[key] += 1
            tokens[key] += len(document.ids)
        if lines % config.log_interval == 0:
            _log(progress, progress_line(lines, time.perf_counter() - started, read_bytes))
    for key, prefix in prefixes.items():
        builders[key].finalize(f"{prefix}.idx")
    return PreprocessSummary(prefixes, documents, tokens, empty, lines, read_bytes,
                             time.perf_counter() - started)


def _log(progress, line: str) -> None:
    """The library prints nothing itself: the progress line goes through the caller's bar
    (tools/preprocess_data.py's tqdm, whose ``write`` prints even when the bar is hidden)."""
    if progress is not None:
        progress.write(line, file=sys.stderr)


def _remove_outputs(prefixes: dict[str, str]) -> None:
    for prefix in prefixes.values():
        for path in (f"{prefix}.bin", f"{prefix}.idx"):
            if os.path.exists(path):
                os.remove(path)
