"""A resume on indexed data continues the saved stream or is refused in one line: the data
position is in the checkpoint; split, sample count (megatron-core's shuffle), blend weights and
the datasets' content are checked (resume/consistency.py). The end-to-end resume (4 + 4 == 8
losses) is in test_indexed_training.py."""

from __future__ import annotations

import pytest

from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.errors import CheckpointError
from megatron.varlen_training.resume.consistency import check_run_args, data_position_note
from megatron.varlen_training.resume.run_args_record import save_run_args
from tests.unit_tests.varlen_training.datasets.indexed_corpus import write_corpus

BASE = ["--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2",
        "--seq-length", "32", "--global-batch-size", "4", "--lr", "1e-3",
        "--tokenizer-type", "ByteLevelTokenizer", "--split", "90,10,0"]


@pytest.fixture
def saved(tmp_path):
    """A checkpoint folder's run_args.json of a run on a 0.7/0.3 blend, saved at iteration 2."""
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    write_corpus(a, 30, seed=1)
    write_corpus(b, 30, seed=2)
    flags = BASE + ["--data-path", "0.7", a, "0.3", b]
    folder = tmp_path / "ckpt"
    folder.mkdir()
    save_run_args(str(folder), _run(flags, "--train-iters", "4"), iteration=2)
    return str(folder), flags, a


def _run(flags, *extra):
    return parse_run_config(list(flags) + list(extra), world_size=1)


def _refusal(folder, run) -> str:
    with pytest.raises(CheckpointError) as err:
        check_run_args(folder, run)
    return str(err.value)


def test_same_run_resumes_at_the_saved_position(saved):
    folder, flags, _ = saved
    run = _run(flags, "--train-iters", "4")
    assert check_run_args(folder, run) is None
    assert data_position_note(folder, 2, run) == (
        "resuming the training data at sample 8 (iteration 2 x global batch 4)")


def test_position_that_disagrees_with_the_iteration_is_refused(saved):
    folder, flags, _ = saved
    with pytest.raises(CheckpointError, match="records 8 consumed training samples but "
                                              "iteration 3 x --global-batch-size 4 is 12"):
        data_position_note(folder, 3, _run(flags, "--train-iters", "4"))


def test_other_split_is_refused(saved):
    folder, flags, _ = saved
    flags = [flag if flag != "90,10,0" else "80,20,0" for flag in flags]
    assert _refusal(folder, _run(flags, "--train-iters", "4")) == (
        "--load: the checkpoint was trained with --split 90,10,0, this run has 80,20,0: that "
        "would change the data order; use the checkpoint's value")


def test_other_sample_count_is_refused_unless_overridden(saved):
    folder, flags, _ = saved
    assert _refusal(folder, _run(flags, "--train-iters", "8")).startswith(
        "--load: the checkpoint's indexed data was built for 16 training samples "
        "(--train-iters x --global-batch-size), this run's for 32: megatron-core shuffles")
    note = check_run_args(folder, _run(flags, "--train-iters", "8",
                                       "--override-data-fingerprint"))
    assert note.startswith("--override-data-fingerprint: --load: the checkpoint's indexed data")


def test_other_weights_are_refused(saved):
    folder, flags, _ = saved
    flags = [{"0.7": "0.6", "0.3": "0.4"}.get(flag, flag) for flag in flags]
    assert _refusal(folder, _run(flags, "--train-iters", "4")).startswith(
        "--load: --data-path entry 1 is '0.6', the checkpoint was trained on '0.7'")


def test_changed_index_is_refused(saved):
    folder, flags, a = saved
    write_corpus(a, 30, seed=9)  # same prefix, other documents
    message = _refusal(folder, _run(flags, "--train-iters", "4"))
    assert message.startswith(f"--load: --data-path entry 2 is '{a}' ({a}: "), message
    assert "pass --override-data-fingerprint to train on this data deliberately" in message
