"""The whole-document blend's sample table under --data-cache-path: the saved table is
megatron-core's (its blending function, called here directly), built once, memory-mapped, and
named by what it holds. A run reading through the cache: test_whole_document_blend.py; four
ranks sharing it: test_whole_document_training.py."""

from __future__ import annotations

import numpy as np
import pytest
from megatron.core.datasets import helpers_cpp

from megatron.varlen_training.datasets.blending_cache import cache_paths, cached_blending_indices
from megatron.varlen_training.errors import UserInputError

WEIGHTS = np.array([0.5, 0.3, 0.2])
SAMPLES = 1000


def _megatron_core(weights: np.ndarray, num_samples: int):
    dataset_index = np.zeros(num_samples, dtype=np.int16)
    sample_index = np.zeros(num_samples, dtype=np.int64)
    helpers_cpp.build_blending_indices(dataset_index, sample_index, weights, len(weights),
                                       num_samples, False)
    return dataset_index, sample_index


class _Counting:
    def __init__(self):
        self.calls = 0

    def __call__(self, weights, num_samples):
        self.calls += 1
        return _megatron_core(weights, num_samples)


def _assert_equal(ours, theirs) -> None:
    for mine, reference in zip(ours, theirs, strict=True):
        assert mine.dtype == reference.dtype and np.array_equal(mine, reference)


def test_the_table_is_built_once_and_memory_mapped(tmp_path):
    build = _Counting()
    first = cached_blending_indices(build, WEIGHTS, SAMPLES, str(tmp_path), "train")
    again = cached_blending_indices(build, WEIGHTS, SAMPLES, str(tmp_path), "train")
    assert build.calls == 1
    for table in (first, again):
        _assert_equal(table, _megatron_core(WEIGHTS, SAMPLES))
        assert all(isinstance(array, np.memmap) for array in table)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        p.rsplit("/", 1)[1] for p in cache_paths(str(tmp_path), WEIGHTS, SAMPLES, "train"))


def test_another_blend_never_reads_a_stale_table(tmp_path):
    build = _Counting()
    cached_blending_indices(build, WEIGHTS, SAMPLES, str(tmp_path), "train")
    for weights, samples, split in ((WEIGHTS[::-1].copy(), SAMPLES, "train"),
                                    (WEIGHTS, SAMPLES + 1, "train"), (WEIGHTS, SAMPLES, "valid")):
        table = cached_blending_indices(build, weights, samples, str(tmp_path), split)
        _assert_equal(table, _megatron_core(weights, samples))
    assert build.calls == 4 and len(list(tmp_path.iterdir())) == 8


def test_without_a_cache_folder_the_table_is_in_memory(tmp_path):
    table = cached_blending_indices(_megatron_core, WEIGHTS, SAMPLES, None, "train")
    _assert_equal(table, _megatron_core(WEIGHTS, SAMPLES))
    assert not any(isinstance(array, np.memmap) for array in table)


def test_an_unwritable_cache_is_one_line(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(UserInputError) as err:  # exit code 2 at the entry points
        cached_blending_indices(_megatron_core, WEIGHTS, SAMPLES, str(blocker / "cache"), "train")
    message = str(err.value)
    assert "\n" not in message and message.startswith(
        "--data-cache-path: cannot save the whole-document blend's sample table (2000 bytes) as ")
    assert message.endswith("choose a writable --data-cache-path with room for it")


def test_a_table_missing_on_a_rank_is_one_line(tmp_path, monkeypatch):
    """A rank on another node than rank 0, with the cache on its own disk, finds no table."""
    from megatron.varlen_training.datasets import blending_cache

    monkeypatch.setattr(blending_cache, "_save_once", lambda *args: None)  # rank 0 elsewhere
    with pytest.raises(UserInputError) as err:
        cached_blending_indices(_megatron_core, WEIGHTS, SAMPLES, str(tmp_path), "train")
    path = cache_paths(str(tmp_path), WEIGHTS, SAMPLES, "train")[0]
    assert str(err.value) == (
        f"--data-cache-path: the whole-document blend's sample table that rank 0 saved is not "
        f"at {path} on this rank: with several nodes, --data-cache-path must be a folder every "
        f"node sees")
