"""tools/preprocess_data.py and pretrain_gpt.py with Megatron-LM's classic GPT recipe,
``--tokenizer-type GPT2BPETokenizer --vocab-file F --merge-file F``: the written documents are
GPT-2's ids (an independent BPE over the same tiny files) plus the eod, and a short single-rank
run on them, with the start-up eod checks engaged (--eod-mask-loss), gives the losses of the same
files trained as NullTokenizer ids of the same vocabulary size (whose eod, vocabulary - 1, is the
tiny vocabulary's <|endoftext|>)."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest
from megatron.core.datasets.indexed_dataset import IndexedDataset

from tests.harness.extras import needs_extra
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import loss_owner_history, train_on_this_rank
from tools.preprocess_data import main

regex = pytest.importorskip("regex")  # the reference's pre-tokenizer (a transformers dependency)
from tests.unit_tests.varlen_training.gpt2_files import (  # noqa: E402
    EOD_TOKEN, reference_ids, vocabulary, write_gpt2_files,
)

pytestmark = needs_extra("hf")
WORDS = ["hello", "world", "the", "cafe", "caf\u00e9", "in", "a", "12", "tea", "hell", "o"]
DOCUMENTS = 80
TRAIN_ITERS = 3
DIVISIBLE_BY = 32  # --make-vocab-size-divisible-by (TP 1)


def _texts() -> list[str]:
    rng = np.random.default_rng(11)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 25)))) + "\n"
            for _ in range(DOCUMENTS)]


@pytest.fixture(scope="module")
def gpt2_data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2_data")
    vocab_file, merge_file = write_gpt2_files(folder)
    corpus = folder / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in _texts()), "utf-8")
    code = main(["--input", str(corpus), "--tokenizer-type", "GPT2BPETokenizer",
                 "--vocab-file", str(vocab_file), "--merge-file", str(merge_file),
                 "--append-eod", "--output-prefix", str(folder / "gpt2"), "--workers", "1"])
    assert code == 0
    return folder, ["--vocab-file", str(vocab_file), "--merge-file", str(merge_file)]


def test_documents_are_gpt2_ids_and_the_eod(gpt2_data):
    folder, _ = gpt2_data
    dataset = IndexedDataset(str(folder / "gpt2_text_document"))  # megatron-core's reader
    eod = vocabulary()[EOD_TOKEN]
    written = [np.array(dataset[i]).tolist() for i in range(len(dataset))]
    assert written == [reference_ids(text) + [eod] for text in _texts()]


def train_recording_log(argv: list[str]) -> dict:
    """train_on_this_rank, plus the messages logged under the "megatron" logger."""
    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logging.getLogger("megatron").addHandler(handler)
    try:
        return {**train_on_this_rank(argv), "messages": messages}
    finally:
        logging.getLogger("megatron").removeHandler(handler)


def _train(folder: Path, tokenizer_flags: list[str], cache: str) -> tuple[list[float], list]:
    argv = [
        "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "4",
        "--lr", "2e-3", "--make-vocab-size-divisible-by", str(DIVISIBLE_BY),
        "--hidden-dropout", "0",
        "--attention-dropout", "0", "--log-interval", "1", "--eval-iters", "0", "--seed", "5",
        "--train-iters", str(TRAIN_ITERS), "--split", "100,0,0", "--num-workers", "0",
        "--eod-mask-loss", "--data-path", str(folder / "gpt2_text_document"),
        "--data-cache-path", str(folder / cache), *tokenizer_flags]
    results = run_distributed(train_recording_log, 1, args=(argv,), timeout_s=240)
    return [entry["lm_loss"] for entry in loss_owner_history(results)], results[0]["messages"]


def test_trains_as_the_same_ids_under_null_tokenizer(gpt2_data):
    folder, files = gpt2_data
    gpt2, messages = _train(folder, ["--tokenizer-type", "GPT2BPETokenizer", *files],
                            "cache_gpt2")
    null, _ = _train(folder, ["--tokenizer-type", "NullTokenizer", "--vocab-size",
                              str(len(vocabulary()))], "cache_null")
    assert len(gpt2) == TRAIN_ITERS and all(np.isfinite(gpt2))
    assert gpt2 == null
    # Megatron-LM's start-up lines; its padding: ceil(vocabulary / (divisible-by x TP))
    vocab = len(vocabulary())
    padded = math.ceil(vocab / DIVISIBLE_BY) * DIVISIBLE_BY
    assert "> building GPT2BPETokenizer tokenizer ..." in messages
    assert (f" > padded vocab (size: {vocab}) with {padded - vocab} dummy tokens "
            f"(new size: {padded})") in messages


@pytest.mark.parametrize("flags, needle", [
    (["--tokenizer-type", "TikTokenizer", "--tokenizer-model", "x.tiktoken"], "TikTokenizer"),
    (["--tokenizer-type", "GPT2BPETokenizer"], "--vocab-file"),
    (["--tokenizer-type", "ByteLevelTokenizer", "--merge-file", "m.txt"], "--merge-file"),
    (["--tokenizer-type", "ByteLevelTokenizer", "--vocab-extra-ids", "100"], "--vocab-extra-ids"),
])
def test_refusals_are_one_line_and_exit_2(tmp_path, capsys, flags, needle):
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text(json.dumps({"text": "hello"}) + "\n", "utf-8")
    code = main(["--input", str(corpus), "--output-prefix", str(tmp_path / "out"),
                 "--workers", "1", *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and needle in err[0], err
    assert not list(tmp_path.glob("out*"))


def test_hf_special_tokens_flag_stays_honoured_here(gpt2_data, tmp_path):
    """The training layer refuses --tokenizer-hf-no-include-special-tokens (it reads ids); the
    tool, which turns text into ids, keeps it (GPT-2 adds no BOS: the same files)."""
    folder, files = gpt2_data
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text(json.dumps({"text": "hello world"}) + "\n", "utf-8")
    assert main(["--input", str(corpus), "--tokenizer-type", "GPT2BPETokenizer", *files,
                 "--tokenizer-hf-no-include-special-tokens", "--output-prefix",
                 str(tmp_path / "out"), "--workers", "1"]) == 0
    dataset = IndexedDataset(str(tmp_path / "out_text_document"))
    assert np.array(dataset[0]).tolist() == reference_ids("hello world")
