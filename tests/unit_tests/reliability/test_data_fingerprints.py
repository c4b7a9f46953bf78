"""A folder ``--data-path`` (Parquet shards, a ``datasets.save_to_disk`` folder) is identified
by its files' content on resume, not by its path; a data file is hashed once per run, not at
every save (megatron/varlen_training/data_fingerprints.py).

- the folder's fingerprint is built from the single-file fingerprints (the same SHA-256 per
  file) and changes with a shard's content, a new shard or a removed one;
- a checkpoint trained on a folder refuses, in one line naming the shard, a resume on changed
  shard content (the run_args.json check, and end to end through pretrain_gpt.py's path);
- a run on one .parquet file that saves after every iteration reads that file for its
  fingerprint once (the hash calls are counted).
"""

import hashlib
import os

import pytest

from megatron.varlen_training import data_fingerprints
from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.errors import CheckpointError
from megatron.varlen_training.resume.consistency import check_run_args
from megatron.varlen_training.resume.run_args_record import save_run_args
from tests.harness.extras import needs_extra
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import train_on_this_rank
from tests.unit_tests.varlen_training.datasets.sft_files import (
    conversations, write_parquet, write_saved_dataset, write_shards,
)

pytestmark = needs_extra("data")

WRITERS = {"shards": write_shards, "save_to_disk": write_saved_dataset}
ARGV = ["--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2",
        "--seq-length", "64", "--lr", "1e-3", "--global-batch-size", "4",
        "--micro-batch-size", "1", "--eval-iters", "0", "--sft", "--tokenizer-type",
        "ByteLevelTokenizer", "--seed", "3"]


def _run(data_path: str, *extra: str):
    return parse_run_config(ARGV + ["--train-iters", "2", "--data-path", data_path, *extra],
                            world_size=1)


def _data_files(folder: str) -> list[str]:
    return sorted(name for name in os.listdir(folder)
                  if name.endswith((".parquet", ".arrow")) or name == "state.json")


@pytest.mark.parametrize("form", sorted(WRITERS))
def test_folder_fingerprint_is_made_of_its_files_fingerprints(tmp_path, form):
    folder = WRITERS[form](conversations(12, seed=1), tmp_path / form)
    got = data_fingerprints.data_fingerprint(folder)
    names = _data_files(folder)
    assert [name for name, _, _ in got["files"]] == names and len(names) >= 2
    combined = hashlib.sha256()
    for name in names:
        with open(os.path.join(folder, name), "rb") as handle:  # independent of the module
            content = handle.read()
        digest = hashlib.sha256(content).hexdigest()
        assert data_fingerprints.file_fingerprint(os.path.join(folder, name))["sha256"] == digest
        combined.update(f"{name}\0{len(content)}\0{digest}\n".encode())
    assert got["sha256"] == combined.hexdigest()
    assert got["size"] == sum(os.path.getsize(os.path.join(folder, n)) for n in names)


def _rewrite_shard(folder: str) -> str:
    """Another conversation set in the second shard (content and size change)."""
    name = sorted(n for n in os.listdir(folder) if n.endswith(".parquet"))[1]
    write_parquet(conversations(5, seed=9), os.path.join(folder, name))
    return name


@pytest.mark.parametrize("change, state", [("rewrite", "changed"), ("add", "is new"),
                                           ("remove", "is missing")])
def test_changed_shards_are_refused_in_one_line(tmp_path, change, state):
    folder = write_shards(conversations(12, seed=1), tmp_path / "shards")
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    save_run_args(str(checkpoint), _run(folder), iteration=2)
    assert check_run_args(str(checkpoint), _run(folder)) is None
    if change == "rewrite":
        name = _rewrite_shard(folder)
    elif change == "add":
        name = "part-00003.parquet"
        write_parquet(conversations(2, seed=4), os.path.join(folder, name))
    else:
        name = "part-00002.parquet"
        os.remove(os.path.join(folder, name))
    with pytest.raises(CheckpointError) as err:
        check_run_args(str(checkpoint), _run(folder))
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"--load: --data-path entry 1 is {folder!r} ({folder}: ")
    assert f"(in the folder, {name} {state}): other data would change the samples" in message
    note = check_run_args(str(checkpoint), _run(folder, "--override-data-fingerprint"))
    assert note.startswith("--override-data-fingerprint: resuming on other data")


def test_a_folder_recorded_by_path_still_resumes(tmp_path, monkeypatch):
    """Checkpoints written before folders were fingerprinted recorded the spelled path."""
    folder = write_shards(conversations(12, seed=1), tmp_path / "shards")
    monkeypatch.chdir(tmp_path)
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    monkeypatch.setattr(data_fingerprints, "folder_fingerprint", lambda entry: {"path": entry})
    save_run_args(str(checkpoint), _run("shards"), iteration=2)
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    assert check_run_args(str(checkpoint), _run("shards")) is None


# --- end to end: pretrain_gpt.py's path on one rank -------------------------------------------

def _train(argv: list[str], cache: str) -> dict:
    import datasets

    datasets.config.HF_DATASETS_CACHE = cache  # the test's folder, not the user's
    return train_on_this_rank(argv)


def _refusal(argv: list[str], cache: str) -> str | None:
    try:
        _train(argv, cache)
    except CheckpointError as err:
        return str(err)
    return None


def test_resume_on_changed_shard_content_is_refused(tmp_path):
    folder = write_shards(conversations(16, seed=1), tmp_path / "shards")
    cache, root = str(tmp_path / "hf_cache"), str(tmp_path / "ckpt")
    run_distributed(_train, 1, args=(ARGV + ["--train-iters", "2", "--data-path", folder,
                                             "--save", root], cache), timeout_s=180)
    name = _rewrite_shard(folder)
    message = run_distributed(_refusal, 1, args=(ARGV + ["--train-iters", "3", "--data-path",
                                                         folder, "--load", root], cache),
                              timeout_s=180)[0]
    assert message is not None and "\n" not in message
    assert message.startswith(f"--load: --data-path entry 1 is {folder!r}"), message
    assert f"(in the folder, {name} changed)" in message, message


def _count_data_hashes(argv: list[str], cache: str, data_file: str) -> int:
    real = os.path.realpath(data_file)
    reads = []
    counted = data_fingerprints.file_digest

    def counting(path):
        if os.path.realpath(path) == real:
            reads.append(path)
        return counted(path)

    data_fingerprints.file_digest = counting
    _train(argv, cache)
    return len(reads)


def test_a_data_file_is_hashed_once_per_run(tmp_path):
    data = write_parquet(conversations(16, seed=1), tmp_path / "chats.parquet")
    root = str(tmp_path / "ckpt")
    argv = ARGV + ["--train-iters", "3", "--save-interval", "1", "--data-path", data,
                   "--save", root]
    reads = run_distributed(_count_data_hashes, 1, args=(argv, str(tmp_path / "hf_cache"),
                                                        data), timeout_s=180)[0]
    assert sorted(os.listdir(root))[:3] == ["iter_0000001", "iter_0000002", "iter_0000003"]
    assert reads == 1
