"""Corrupted, truncated, partial or crafted checkpoints are
refused in one line before anything in them is used (or run); saves publish atomically."""

import json
import os
import pickle
import shutil

import pytest
import torch
from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING
from torch.distributed.checkpoint.planner import WriteItemType

from megatron.varlen_training.checkpoint import TRACKER_FILENAME, checkpoint_dir
from megatron.varlen_training.checkpoint.integrity import MANIFEST_FILENAME, file_digest
from megatron.varlen_training.checkpoint.safe_load import (
    METADATA_FILENAME,
    RestrictedUnpickler,
    check_metadata_is_safe,
)
from megatron.varlen_training.errors import CheckpointError
from megatron.varlen_training.load_options import LoadParts
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import TINY_GPT_ARGS, train_on_this_rank

ARGS = TINY_GPT_ARGS + ["--lr-decay-iters", "4"]
CORRUPT_BYTES = 4096


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    run_distributed(train_on_this_rank, 1, args=(ARGS + ["--train-iters", "2", "--save",
                                                         str(root)],), timeout_s=120)
    return root


@pytest.fixture
def ckpt(saved, tmp_path):
    root = tmp_path / "ckpt"
    shutil.copytree(saved, root)
    return root


def _load_error(argv):
    """Resumes; returns the one-line CheckpointError message, or None if the load worked."""
    try:
        train_on_this_rank(argv)
    except CheckpointError as err:
        return str(err)
    return None


def _resume(root) -> str | None:
    return run_distributed(_load_error, 1, args=(ARGS + ["--train-iters", "3", "--load",
                                                         str(root)],), timeout_s=120)[0]


def _shard(root):
    folder = checkpoint_dir(str(root), 2)
    return os.path.join(folder, sorted(n for n in os.listdir(folder) if n.endswith(".distcp"))[0])


def test_save_publishes_a_complete_verified_folder(ckpt):
    assert (ckpt / TRACKER_FILENAME).read_text() == "2"
    assert sorted(os.listdir(ckpt)) == ["iter_0000002", TRACKER_FILENAME]  # no staging left
    folder = ckpt / "iter_0000002"
    files = json.loads((folder / MANIFEST_FILENAME).read_text())["files"]
    on_disk = {os.path.relpath(os.path.join(d, n), folder) for d, _, ns in os.walk(folder)
               for n in ns} - {MANIFEST_FILENAME}
    assert set(files) == on_disk and {".metadata", "common.pt", "run_args.json",
                                      "rng/rank_00000.pt"} <= on_disk
    assert _resume(ckpt) is None


def test_corrupted_shard_is_refused(ckpt):
    shard = _shard(ckpt)
    with open(shard, "r+b") as handle:
        handle.seek(os.path.getsize(shard) // 2)
        handle.write(os.urandom(CORRUPT_BYTES))
    message = _resume(ckpt)
    assert message == (f"checkpoint file {shard!r} is corrupted: its sha256 differs from the "
                       "one recorded at save")


def test_truncated_shard_is_refused(ckpt):
    shard = _shard(ckpt)
    size = os.path.getsize(shard)
    os.truncate(shard, size // 2)
    assert _resume(ckpt) == (f"checkpoint file {shard!r} is truncated or altered: {size // 2} "
                             f"bytes, {size} were written")


@pytest.mark.parametrize("text, word", [("", "empty"), ("3\x00garbage", "garbled")])
def test_bad_tracker_is_refused(ckpt, text, word):
    (ckpt / TRACKER_FILENAME).write_text(text)
    message = _resume(ckpt)
    assert message.startswith(f"tracker file '{ckpt / TRACKER_FILENAME}' is {word}"), message


def test_missing_iteration_folder_is_refused(ckpt):
    shutil.rmtree(ckpt / "iter_0000002")
    assert _resume(ckpt) == (f"{TRACKER_FILENAME} in '{ckpt}' names iteration 2 but "
                             f"'{ckpt / 'iter_0000002'}' is missing")


def test_partial_folder_without_manifest_is_refused(ckpt):
    os.remove(ckpt / "iter_0000002" / MANIFEST_FILENAME)
    assert "has no manifest.json: it was not completely written" in _resume(ckpt)


class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _forge(folder, name, payload: bytes) -> None:
    """Replaces ``name`` and fixes the manifest, as a forger would."""
    (folder / name).write_bytes(payload)
    manifest = json.loads((folder / MANIFEST_FILENAME).read_text())
    manifest["files"][name] = file_digest(str(folder / name))
    (folder / MANIFEST_FILENAME).write_text(json.dumps(manifest))


@pytest.mark.parametrize("name, needle", [
    (".metadata", "': it names posix.system"),
    ("common.pt", "': it holds more than tensors and plain containers"),
])
def test_crafted_pickle_does_not_run(ckpt, tmp_path, name, needle):
    marker = tmp_path / "pwned"
    folder = ckpt / "iter_0000002"
    _forge(folder, name, pickle.dumps(_Exploit(marker)))
    message = _resume(ckpt)
    assert not marker.exists(), "the crafted checkpoint ran code"
    assert message.startswith(f"refusing to load '{folder / name}{needle}"), message
    assert "\n" not in message


# A pickled reference to a module of this repository (an object of one of our classes) would
# tie every checkpoint to today's module layout: after a module moved, the checkpoints saved
# before could not be unpickled. torch's and megatron-core's classes are all a checkpoint holds;
# run_args.json and the other JSON files are read as text, not unpickled.
OUR_PACKAGES = (b"megatron.varlen", b"megatron.wrap")  # the first covers varlen_training


def _names_of_ours(root) -> list[str]:
    """The files under ``root`` (JSON aside) whose bytes name one of :data:`OUR_PACKAGES`
    (pickles and torch's zip files store module names as plain text)."""
    return [f"{path.relative_to(root)}: {package.decode()}"
            for path in sorted(root.rglob("*")) if path.is_file() and path.suffix != ".json"
            for package in OUR_PACKAGES if package in path.read_bytes()]


def test_no_checkpoint_file_pickles_a_class_of_ours(saved):
    assert len([path for path in saved.rglob("*") if path.is_file()]) > 5  # the scan saw files
    assert _names_of_ours(saved) == []


def test_the_module_name_scan_can_fail(tmp_path):
    torch.save({"parts": LoadParts()}, tmp_path / "common.pt")
    assert _names_of_ours(tmp_path) == ["common.pt: megatron.varlen"]


class _PickledAs:
    """Pickles as ``function(*args)``: writes the reduce form another Python would write."""

    def __init__(self, function, *args):
        self.function, self.args = function, args

    def __reduce__(self):
        return self.function, self.args


def _restricted_load(tmp_path, obj):
    (tmp_path / METADATA_FILENAME).write_bytes(pickle.dumps(obj))
    check_metadata_is_safe(str(tmp_path))  # raises CheckpointError if refused
    with open(tmp_path / METADATA_FILENAME, "rb") as handle:
        return RestrictedUnpickler(handle, "test").load()


def test_enum_members_pickled_through_getattr_are_accepted(tmp_path):
    """Python 3.11.2 and 3.12+ (the GPU image) pickle enum members as getattr(Enum, "NAME");
    torch's checkpoint metadata holds such members, so those checkpoints must load."""
    members = [_MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT, WriteItemType.TENSOR]
    loaded = _restricted_load(tmp_path, [_PickledAs(getattr, type(m), m.name) for m in members])
    assert loaded == members


@pytest.mark.parametrize("cls, name", [
    (torch.Size, "__class__"),  # a way out of the allow-list: type -> object -> subclasses
    (WriteItemType, "__init__"),  # an enum class, but not a member
    (WriteItemType, "__class__"),
])
def test_getattr_reaches_nothing_but_enum_members(tmp_path, cls, name):
    with pytest.raises(CheckpointError, match=f"attribute {name!r}"):
        _restricted_load(tmp_path, _PickledAs(getattr, cls, name))


# --- the manifest covers the whole checkpoint ---------------------


def _edit_manifest(folder, edit) -> None:
    manifest = json.loads((folder / MANIFEST_FILENAME).read_text())
    edit(manifest["files"])
    (folder / MANIFEST_FILENAME).write_text(json.dumps(manifest))


def _corrupt(path) -> None:
    with open(path, "r+b") as handle:
        handle.seek(os.path.getsize(path) // 2)
        handle.write(os.urandom(CORRUPT_BYTES))


def test_emptied_manifest_does_not_hide_a_corrupted_shard(ckpt):
    shard = _shard(ckpt)
    _corrupt(shard)
    folder = ckpt / "iter_0000002"
    _edit_manifest(folder, dict.clear)
    message = _resume(ckpt)
    assert message == (f"checkpoint file '{folder / '.metadata'}' is not listed in manifest.json:"
                       " the manifest does not cover the whole checkpoint (edited, or a file was"
                       " added after the save); load another checkpoint"), message


def test_unlisted_shard_is_refused(ckpt):
    shard = _shard(ckpt)
    _corrupt(shard)
    _edit_manifest(ckpt / "iter_0000002", lambda files: files.pop(os.path.basename(shard)))
    message = _resume(ckpt)
    assert message.startswith(f"checkpoint file '{shard}' is not listed in manifest.json"), message


def test_file_added_after_the_save_is_refused(ckpt):
    extra = ckpt / "iter_0000002" / "notes.txt"
    extra.write_text("hello")
    assert _resume(ckpt).startswith(f"checkpoint file '{extra}' is not listed in manifest.json")


@pytest.mark.parametrize("name, why", [
    ("__0_1.distcp", "named by .metadata"),
    ("rng/rank_00000.pt", "the random states of rank 0 of 1"),
    ("run_args.json", "every checkpoint has one"),
    ("common.pt", "every checkpoint has one"),
    ("metadata.json", "every checkpoint has one"),
])
def test_required_file_removed_with_its_entry_is_refused(ckpt, name, why):
    folder = ckpt / "iter_0000002"
    os.remove(folder / name)
    _edit_manifest(folder, lambda files: files.pop(name))
    assert _resume(ckpt) == (f"checkpoint file '{folder / name}' is missing and not listed in "
                             f"manifest.json ({why}): the checkpoint is incomplete; load another "
                             f"checkpoint")


@pytest.mark.parametrize("entry, name", [
    (5, "common.pt"),
    ({"size": 12}, "common.pt"),
    ({"size": "12", "sha256": "0" * 64}, "common.pt"),
    ({"size": 12, "sha256": "0" * 64}, "../outside.txt"),
    ({"size": 12, "sha256": "0" * 64}, "/etc/hostname"),
])
def test_malformed_manifest_entry_is_one_line(ckpt, entry, name):
    folder = ckpt / "iter_0000002"
    _edit_manifest(folder, lambda files: files.update({name: entry}))
    message = _resume(ckpt)
    assert message.startswith(f"checkpoint manifest '{folder / MANIFEST_FILENAME}' "), message
    assert repr(name) in message and "\n" not in message, message


@pytest.mark.parametrize("text", ["[]", '{"files": []}', "{not json"])
def test_garbled_manifest_is_one_line(ckpt, text):
    folder = ckpt / "iter_0000002"
    (folder / MANIFEST_FILENAME).write_text(text)
    message = _resume(ckpt)
    assert message.startswith(f"checkpoint manifest '{folder / MANIFEST_FILENAME}' is "
                              "unreadable"), message


# --- malformed small files are one line naming the file -----------


@pytest.mark.parametrize("name, payload, needle", [
    ("rng/rank_00000.pt", pickle.dumps(_Exploit("/nonexistent/pwned")), "is unreadable"),
    ("rng/rank_00000.pt", b"\x00garbage", "is unreadable"),
    ("rng/rank_00000.pt", None, "holds no valid random states"),  # a dict of the wrong shape
    ("run_args.json", b"{garbled", "is unreadable"),
    ("run_args.json", b"[1, 2]", "is unreadable"),
    ("metadata.json", b"{garbled", "is unreadable"),
    ("metadata.json", b'{"sharded_backend": "zarr"}', "is unreadable"),
    ("metadata.json", b"[]", "is unreadable"),
], ids=["rng-exploit", "rng-garbage", "rng-wrong-shape", "run-args-garbled", "run-args-list",
        "config-garbled", "config-backend", "config-list"])
def test_malformed_small_file_is_one_line(ckpt, tmp_path, name, payload, needle):
    if payload is None:
        buffer = tmp_path / "forged.pt"
        torch.save({"layout": [1, 1, 1, 1], "python": "x"}, buffer)
        payload = buffer.read_bytes()
    folder = ckpt / "iter_0000002"
    _forge(folder, name, payload)
    message = _resume(ckpt)
    assert message is not None and message.startswith(f"checkpoint file '{folder / name}' "), \
        message
    assert needle in message and "\n" not in message, message
