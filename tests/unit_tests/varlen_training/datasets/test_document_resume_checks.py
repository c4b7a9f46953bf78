"""A resume keeps the packing unit: whole documents and --seq-length samples are different
streams, so --packing-unit is a data-order key of run_args.json (resume/consistency.py);
checkpoints written before the key existed were --packing-unit sample runs. A blend's weights
and datasets are checked as those of a --packing-unit sample blend."""

from __future__ import annotations

import json
import os

import pytest

from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.errors import CheckpointError
from megatron.varlen_training.resume.consistency import check_run_args
from megatron.varlen_training.resume.run_args_record import save_run_args
from tests.unit_tests.varlen_training.datasets.indexed_corpus import write_corpus

PACKED = ["--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2",
          "--seq-length", "32", "--global-batch-size", "4", "--lr", "1e-3",
          "--tokenizer-type", "ByteLevelTokenizer", "--split", "90,10,0", "--train-iters", "4",
          "--micro-batch-size", "1", "--sequence-packing"]


def _run(prefix: str, unit: str):
    return parse_run_config(PACKED + ["--data-path", prefix, "--packing-unit", unit],
                            world_size=1)


@pytest.fixture
def prefix(tmp_path):
    path = str(tmp_path / "corpus")
    write_corpus(path, 30, seed=1)
    return path


def test_packing_unit_change_is_refused(tmp_path, prefix):
    folder = str(tmp_path / "ckpt")
    os.makedirs(folder)
    save_run_args(folder, _run(prefix, "document"), iteration=2)
    assert check_run_args(folder, _run(prefix, "document")) is None
    with pytest.raises(CheckpointError) as err:
        check_run_args(folder, _run(prefix, "sample"))
    assert str(err.value) == (
        "--load: the checkpoint was trained with --packing-unit document, this run has sample: "
        "that would change the data order; use the checkpoint's value")


def test_checkpoints_from_before_the_key_were_sample_runs(tmp_path, prefix):
    folder = str(tmp_path / "ckpt")
    os.makedirs(folder)
    save_run_args(folder, _run(prefix, "sample"), iteration=2)
    path = os.path.join(folder, "run_args.json")
    recorded = json.loads(open(path).read())
    del recorded["packing_unit"]
    with open(path, "w") as handle:
        json.dump(recorded, handle)
    assert check_run_args(folder, _run(prefix, "sample")) is None
    with pytest.raises(CheckpointError, match="--packing-unit sample, this run has document"):
        check_run_args(folder, _run(prefix, "document"))


@pytest.fixture
def blend(tmp_path):
    """A checkpoint folder of a --packing-unit document run on a 0.7/0.3 blend, and its flags."""
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    write_corpus(a, 30, seed=1)
    write_corpus(b, 30, seed=2)
    flags = PACKED + ["--packing-unit", "document", "--data-path", "0.7", a, "0.3", b]
    folder = str(tmp_path / "ckpt")
    os.makedirs(folder)
    save_run_args(folder, parse_run_config(flags, world_size=1), iteration=2)
    return folder, flags, b


def test_a_blend_resumes_only_on_its_weights_and_datasets(blend):
    """As --packing-unit sample blends (test_indexed_resume_checks.py): the weights are
    compared as spelled, the datasets by content."""
    folder, flags, b = blend
    assert check_run_args(folder, parse_run_config(flags, world_size=1)) is None
    other_weights = [{"0.7": "0.6", "0.3": "0.4"}.get(flag, flag) for flag in flags]
    with pytest.raises(CheckpointError, match="^--load: --data-path entry 1 is '0.6', the "
                                              "checkpoint was trained on '0.7'"):
        check_run_args(folder, parse_run_config(other_weights, world_size=1))
    write_corpus(b, 30, seed=9)  # same prefix, other documents
    with pytest.raises(CheckpointError, match=f"^--load: --data-path entry 4 is '{b}' "):
        check_run_args(folder, parse_run_config(flags, world_size=1))


def _budget(prefix: str, unit: str, budget: int, *extra: str):
    """RoPE: no position table bounds the pieces (learned positions would: --seq-length 32)."""
    return parse_run_config(PACKED + ["--data-path", prefix, "--packing-unit", unit,
                                      "--max-seqlen-per-dp-cp-rank", str(budget),
                                      "--position-embedding-type", "rope", *extra],
                            world_size=1)


def _saved_at(tmp_path, run) -> str:
    folder = str(tmp_path / "ckpt")
    os.makedirs(folder, exist_ok=True)
    save_run_args(folder, run, iteration=2)
    return folder


def test_documents_resume_only_on_the_pieces_they_were_cut_into(tmp_path, prefix):
    """--packing-unit document cuts a document only beyond the layout's longest sequence (one
    rank, CP 1: the budget itself), so another budget cuts other pieces: their epoch
    permutation, and so the whole stream, differ. Refused in one line; accepted with
    --override-data-fingerprint (a note); --packing-unit sample runs are not concerned. (A
    layout that runs longer sequences keeps the pieces with --document-piece-length:
    test_document_piece_length.py.)"""
    folder = _saved_at(tmp_path, _budget(prefix, "document", 64))
    assert json.loads(open(os.path.join(folder, "run_args.json")).read())[
        "document_piece_length"] == 64
    assert check_run_args(folder, _budget(prefix, "document", 64)) is None
    with pytest.raises(CheckpointError) as err:
        check_run_args(folder, _budget(prefix, "document", 48))
    assert str(err.value) == (
        "--load: the checkpoint's --packing-unit document run cut documents into pieces of at "
        "most 64 tokens, this run cuts at 48 (--document-piece-length, else the longest "
        "sequence the layout runs: --max-seqlen-per-dp-cp-rank x its largest CP group): other "
        "pieces, so another document order; pass --document-piece-length 64 (on a layout whose "
        "longest sequence is at least that), or --override-data-fingerprint to continue from "
        "the saved position with this run's pieces")
    note = check_run_args(folder, _budget(prefix, "document", 48, "--override-data-fingerprint"))
    assert note.startswith("--override-data-fingerprint: --load: the checkpoint's --packing-unit")
    sample_folder = _saved_at(tmp_path / "sample", _budget(prefix, "sample", 64))
    assert check_run_args(sample_folder, _budget(prefix, "sample", 48)) is None


def test_document_checkpoints_from_before_the_key_are_not_checked_for_it(tmp_path, prefix):
    folder = _saved_at(tmp_path, _budget(prefix, "document", 64))
    path = os.path.join(folder, "run_args.json")
    recorded = json.loads(open(path).read())
    del recorded["document_piece_length"]
    with open(path, "w") as handle:
        json.dump(recorded, handle)
    assert check_run_args(folder, _budget(prefix, "document", 48)) is None


def test_a_document_run_resumes_with_more_iterations(tmp_path, prefix):
    """Whole documents: sample i depends only on (--seed, i) (test_whole_documents.py,
    test_whole_document_blend.py: a shorter run reads the same first samples), so a resume
    may train longer; indexed --seq-length samples may not (megatron-core shuffles over the
    epochs the sample count needs)."""
    longer = ["--train-iters", "8"]
    folder = _saved_at(tmp_path, _budget(prefix, "document", 64))
    assert check_run_args(folder, _budget(prefix, "document", 64, *longer)) is None
    sample_folder = _saved_at(tmp_path / "sample", _budget(prefix, "sample", 64))
    with pytest.raises(CheckpointError, match="indexed data was built for 16 training samples"):
        check_run_args(sample_folder, _budget(prefix, "sample", 64, *longer))
