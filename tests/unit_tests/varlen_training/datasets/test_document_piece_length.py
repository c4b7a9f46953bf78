"""--document-piece-length: where --packing-unit document cuts a document, so that a resume on
a layout that runs longer sequences (a larger budget or CP group: more ranks with dynamic CP)
keeps the checkpoint's pieces, and so its stream.

References outside the code under test: the documents as written, cut by hand; and the run
the checkpoint continues (the same samples, index for index).
"""

from __future__ import annotations

import os
from collections import Counter

import pytest

from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.datasets.builder import build_datasets
from megatron.varlen_training.errors import CheckpointError
from megatron.varlen_training.flag_errors import ArgumentValidationError
from megatron.varlen_training.resume.consistency import check_run_args
from megatron.varlen_training.resume.run_args_record import save_run_args
from megatron.varlen_training.tokenizer import ByteLevelTokenizer
from tests.unit_tests.varlen_training.datasets.indexed_corpus import write_corpus

NUM_DOCUMENTS = 40  # up to 90 training tokens each (indexed_corpus.py)
TRAIN_DOCUMENTS = 36  # --split 90,10,0: megatron-core's first round(0.9 N) documents
SAMPLES = 160  # several epochs of pieces
FLAGS = ["--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2",
         "--seq-length", "32", "--lr", "1e-3", "--micro-batch-size", "1",
         "--tokenizer-type", "ByteLevelTokenizer", "--split", "90,10,0", "--seed", "3",
         "--sequence-packing", "--packing-unit", "document", "--position-embedding-type",
         "rope", "--global-batch-size", "8", "--train-iters", str(SAMPLES // 8)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(prefix, the documents written)."""
    prefix = str(tmp_path_factory.mktemp("pieces") / "corpus")
    return prefix, write_corpus(prefix, NUM_DOCUMENTS, seed=5)


def _run(prefix: str, budget: int, *extra: str):
    return parse_run_config(FLAGS + ["--data-path", prefix, "--max-seqlen-per-dp-cp-rank",
                                     str(budget), *extra], world_size=1)


def _samples(run) -> list[tuple[int, ...]]:
    """Every training sample's ids: its tokens and its last label."""
    train, _ = build_datasets(run, ByteLevelTokenizer())
    return [tuple(s["tokens"][:s["length"]].tolist()) + (int(s["labels"][s["length"] - 1]),)
            for s in (train[i] for i in range(len(train)))]


def _hand_cut(documents, piece: int) -> Counter:
    """The training split's pieces of at most ``piece`` training tokens, cut by hand."""
    pieces = Counter()
    for document in documents[:TRAIN_DOCUMENTS]:
        tokens = len(document) - 1
        for start in range(0, tokens, piece):
            pieces[tuple(document[start: start + min(piece, tokens - start) + 1].tolist())] += 1
    return pieces


def test_documents_are_cut_at_the_flag(corpus):
    """The first epoch reads every hand-cut piece of 20 tokens once, on a layout that runs 64."""
    prefix, documents = corpus
    pieces = _hand_cut(documents, 20)
    samples = _samples(_run(prefix, 64, "--document-piece-length", "20"))
    assert Counter(samples[:sum(pieces.values())]) == pieces
    assert max(len(piece) - 1 for piece in samples) == 20


def test_a_resume_on_a_longer_layout_keeps_the_stream_with_the_flag(corpus, tmp_path):
    """Saved on a budget of 32 (its pieces: 32 tokens); a layout of budget 64 cuts at 64 and
    reads another stream: refused, naming the flag; with --document-piece-length 32 it reads
    the saved run's samples, index for index."""
    prefix, _ = corpus
    saved_run = _run(prefix, 32)
    folder = str(tmp_path / "ckpt")
    os.makedirs(folder)
    save_run_args(folder, saved_run, iteration=2)
    longer = _run(prefix, 64)
    with pytest.raises(CheckpointError, match="pass --document-piece-length 32 "):
        check_run_args(folder, longer)
    kept = _run(prefix, 64, "--document-piece-length", "32")
    assert check_run_args(folder, kept) is None
    straight = _samples(saved_run)
    assert _samples(kept) == straight
    assert _samples(longer) != straight  # what the refusal protects


def test_the_flag_is_held_to_what_the_layout_runs(corpus):
    prefix, _ = corpus
    with pytest.raises(ArgumentValidationError) as err:
        _run(prefix, 64, "--document-piece-length", "65")
    assert str(err.value) == (
        "--document-piece-length 65 is longer than the longest sequence this layout runs (64 "
        "tokens: --max-seqlen-per-dp-cp-rank 64 on its largest CP group): lower it, or raise "
        "--max-seqlen-per-dp-cp-rank or the CP size")
    # learned absolute positions: at most the position table (--seq-length 32 rows)
    with pytest.raises(ArgumentValidationError, match="longer than the longest sequence this "
                                                      r"layout runs \(32 tokens: .* at most "
                                                      "--max-position-embeddings"):
        _run(prefix, 64, "--document-piece-length", "33", "--position-embedding-type",
             "learned_absolute")
    with pytest.raises(ArgumentValidationError, match=r"must be in \[1, "):
        _run(prefix, 64, "--document-piece-length", "0")
    sample_unit = [flag.replace("document", "sample") for flag in FLAGS]
    with pytest.raises(ArgumentValidationError, match="^--document-piece-length cuts whole "
                                                      "documents: it needs --packing-unit "
                                                      "document$"):
        parse_run_config(sample_unit + ["--data-path", prefix, "--document-piece-length", "8"],
                         world_size=1)


def test_a_layout_with_more_ranks_runs_longer_pieces(corpus):
    """Dynamic CP over 4 ranks runs a sequence on all 4: 4 x the budget is allowed, 1 more
    token is not (what a scaled-up resume may keep)."""
    prefix, _ = corpus
    dynamic = ["--dynamic-context-parallel"]
    run = parse_run_config(FLAGS + ["--data-path", prefix, "--max-seqlen-per-dp-cp-rank", "16",
                                    "--document-piece-length", "64", *dynamic], world_size=4)
    assert run.data.document_piece_length == 64
    with pytest.raises(ArgumentValidationError, match="65 is longer than .* runs \\(64 tokens"):
        parse_run_config(FLAGS + ["--data-path", prefix, "--max-seqlen-per-dp-cp-rank", "16",
                                  "--document-piece-length", "65", *dynamic], world_size=4)
