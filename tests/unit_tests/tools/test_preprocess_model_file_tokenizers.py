"""tools/preprocess_data.py and pretrain_gpt.py with Megatron-LM's SentencePiece types and
TikTokenizer (``--tokenizer-model FILE``): the .bin/.idx equal, byte for byte, what
megatron-core's ``IndexedDatasetBuilder`` writes for the packages' own ids of each text (the
sentencepiece processor; a ``tiktoken.Encoding`` of the same ranks) plus the eod (the model's
eos; ``</s>``), by Megatron-LM's rules; and a short single-rank run on them starts, its start-up
checks on the data (ids below the vocabulary, documents' eod) accepting them, with Megatron-LM's
start-up lines."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import pytest

from tests.harness.extras import needs_extra
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import loss_owner_history, train_on_this_rank
from tests.unit_tests.tools.test_preprocess_megatron_parity import (
    RECORDS, _assert_same_files, _reference_files, _run, _write_jsonl,
)
from tests.unit_tests.varlen_training.model_files import (
    CORPUS, tiktoken_ranks, tiktoken_reference, train_sentencepiece, write_tiktoken_vocab,
)

pytestmark = needs_extra("tokenizers")
SENTENCEPIECE_TYPES = ["SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer"]
SPECIAL = ["<unk>", "<s>", "</s>", "<mask>", "<pad>", "<cls>", "<sep>"]  # Megatron-LM's
NUM_SPECIAL = len(SPECIAL)  # no fillers: the smallest TikToken layout
TIKTOKEN_VOCAB = NUM_SPECIAL + len(tiktoken_ranks())
TRAIN_ITERS = 2
DIVISIBLE_BY = 32  # --make-vocab-size-divisible-by (TP 1)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    return train_sentencepiece(folder), write_tiktoken_vocab(folder)


def _tiktoken_flags(vocab_json: Path) -> list[str]:
    return ["--tokenizer-type", "TikTokenizer", "--tokenizer-model", str(vocab_json),
            "--vocab-size", str(TIKTOKEN_VOCAB), "--tiktoken-num-special-tokens",
            str(NUM_SPECIAL), "--tiktoken-pattern", "v1"]


def _reference_ids(kind: str, models) -> tuple:
    """(text -> ids, eod, vocabulary) of the package itself."""
    if kind == "TikTokenizer":
        encoding = tiktoken_reference(_v1_pattern(), SPECIAL, TIKTOKEN_VOCAB)
        return (lambda text: encoding.encode(text, allowed_special="all"),
                SPECIAL.index("</s>"), TIKTOKEN_VOCAB)
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=str(models[0]))
    return processor.encode, processor.eos_id(), processor.get_piece_size()


def _v1_pattern() -> str:
    from megatron.core.tokenizers.text.libraries import tiktoken_tokenizer

    return tiktoken_tokenizer._PATTERN_TIKTOKEN_V1  # Megatron-LM's v1 regex (a fact)


def _flags(kind: str, models) -> list[str]:
    if kind == "TikTokenizer":
        return _tiktoken_flags(models[1])
    return ["--tokenizer-type", kind, "--tokenizer-model", str(models[0])]


@pytest.mark.parametrize("kind", [*SENTENCEPIECE_TYPES, "TikTokenizer"])
def test_files_are_the_packages_ids_as_megatron_lm_writes_them(tmp_path, models, kind):
    corpus = _write_jsonl(tmp_path / "docs.jsonl", RECORDS)
    ours = _run(corpus, tmp_path / "ours", *_flags(kind, models), "--append-eod",
                "--workers", "2")
    ids_of, eod, vocab = _reference_ids(kind, models)
    reference = _reference_files(tmp_path / "reference", RECORDS, ids_of, eod, vocab)
    _assert_same_files(ours, reference)


def _train(folder: Path, flags: list[str]) -> tuple[list[float], list[str]]:
    argv = [
        "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "4",
        "--lr", "2e-3", "--make-vocab-size-divisible-by", str(DIVISIBLE_BY),
        "--log-interval", "1", "--eval-iters", "0", "--seed", "5",
        "--train-iters", str(TRAIN_ITERS), "--split", "100,0,0", "--num-workers", "0",
        "--eod-mask-loss", "--data-path", str(folder / "docs_text_document"),
        "--data-cache-path", str(folder / "cache"), *flags]
    results = run_distributed(_train_recording_log, 1, args=(argv,), timeout_s=240)
    return [entry["lm_loss"] for entry in loss_owner_history(results)], results[0]["messages"]


def _train_recording_log(argv: list[str]) -> dict:
    """train_on_this_rank, plus the messages logged under the "megatron" logger."""
    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logging.getLogger("megatron").addHandler(handler)
    try:
        return {**train_on_this_rank(argv), "messages": messages}
    finally:
        logging.getLogger("megatron").removeHandler(handler)


@pytest.mark.parametrize("kind", [*SENTENCEPIECE_TYPES, "TikTokenizer"])
def test_a_short_run_trains_on_the_preprocessed_data(tmp_path, models, kind):
    """TikTokenizer's flags reach training as they reached preprocessing."""
    records = [{"text": line} for line in CORPUS * 2]
    corpus = _write_jsonl(tmp_path / "docs.jsonl", records)
    _run(corpus, tmp_path / "docs", *_flags(kind, models), "--append-eod", "--workers", "1")
    losses, messages = _train(tmp_path, _flags(kind, models))
    assert len(losses) == TRAIN_ITERS and all(np.isfinite(losses))
    _, _, vocab = _reference_ids(kind, models)
    padded = math.ceil(vocab / DIVISIBLE_BY) * DIVISIBLE_BY  # Megatron-LM's padding
    assert f"> building {kind} tokenizer ..." in messages
    assert (f" > padded vocab (size: {vocab}) with {padded - vocab} dummy tokens "
            f"(new size: {padded})") in messages


def test_data_of_a_larger_vocabulary_is_refused_at_start_up(tmp_path, models):
    """The start-up id check engages: TikToken data (ids up to 276) under the SentencePiece
    model's 64 ids is one line naming the tokenizer's flags, before any step."""
    records = [{"text": line} for line in CORPUS[:4]]
    corpus = _write_jsonl(tmp_path / "docs.jsonl", records)
    _run(corpus, tmp_path / "docs", *_tiktoken_flags(models[1]), "--append-eod", "--workers", "1")
    with pytest.raises(Exception, match="--tokenizer-type Llama2Tokenizer, --tokenizer-model") \
            as err:
        _train(tmp_path, _flags("Llama2Tokenizer", models))
    assert "but the tokenizer has 64 ids" in str(err.value), err.value


def test_text_with_the_special_tokens_is_their_ids(tmp_path, models):
    """TikTokenizer: a special token written in the text is its id (megatron-core's
    ``encode(text, allowed_special="all")``); the SentencePiece types encode it as text."""
    corpus = _write_jsonl(tmp_path / "docs.jsonl", [{"text": "a</s>b"}])
    tik = _run(corpus, tmp_path / "tik", *_tiktoken_flags(models[1]), "--workers", "1")
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    dataset = IndexedDataset(str(tik))  # kept: its arrays view the memory-mapped file
    ids = np.array(dataset[0]).tolist()
    assert ids == [NUM_SPECIAL + ord("a"), SPECIAL.index("</s>"), NUM_SPECIAL + ord("b")]


def test_kept_whitespace_reaches_preprocessing(tmp_path, models):
    """--no-tokenizer-sentencepiece-ignore-extra-whitespaces: the documents are megatron-core's
    placeholder encoding of the runs of spaces, as training would read them."""
    from megatron.core.tokenizers.text.libraries.sentencepiece_tokenizer import (
        SentencePieceTokenizer,
    )

    records = [{"text": "a   b  two  spaces"}, {"text": ["one  two", "x"]}]
    corpus = _write_jsonl(tmp_path / "docs.jsonl", records)
    ours = _run(corpus, tmp_path / "ours", *_flags("Llama2Tokenizer", models), "--append-eod",
                "--no-tokenizer-sentencepiece-ignore-extra-whitespaces", "--workers", "1")
    library = SentencePieceTokenizer(str(models[0]), ignore_extra_whitespaces=False)
    _, eod, vocab = _reference_ids("Llama2Tokenizer", models)
    reference = _reference_files(tmp_path / "reference", records, library.text_to_ids, eod,
                                 vocab)
    _assert_same_files(ours, reference)
