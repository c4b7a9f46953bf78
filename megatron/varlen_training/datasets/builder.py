"""Builds the train, validation and test datasets from the parsed command line.

- ``--mock-data``: :class:`MockGPTDataset` (every sample ``--seq-length`` long).
- ``--mock-data --sft``: :class:`MockSFTDataset`, lengths from ``--sft-mock-dataset-config-json``.
- ``--sft --data-path FILE``: :class:`SFTDataset` over a JSONL file, or
  :class:`ArrowSFTDataset` over Parquet/Arrow (a ``.parquet`` file, a folder of shards, a
  ``datasets.save_to_disk`` folder); :func:`open_sft_data` tells them apart.
- ``--data-path [WEIGHT] PREFIX ...`` (or ``--train-data-path`` ...): Megatron indexed datasets
  through megatron-core's builder (:mod:`.indexed`, which says what a sample is there); with
  ``--packing-unit document`` whole documents instead (:mod:`.whole_documents`,
  blended by :mod:`.whole_document_blend`).

Mock validation and test sets are the same kind of dataset with the seeds
``--seed + VALID_SEED_OFFSET`` and ``--seed + TEST_SEED_OFFSET`` (Megatron-LM's mock data has a
test split too). Indexed data has the test split ``--split`` or ``--test-data-path`` gives it
(megatron-core's builder); ``--packing-unit document`` has none. Real SFT data is split by
position: with ``--split``, megatron-core's document ranges (a test share is the test split);
without, its last ``max(1, round(VALID_FRACTION * N))`` samples are held out for validation
(none when no eval samples are requested) and there is no test split; training reads the rest, one
seeded permutation per epoch, for as many epochs as ``train_samples`` needs; validation cycles
over the held-out tail in file order. Without ``--sequence-packing`` every sample is padded to
``--seq-length`` (the unpacked baseline); with it, to a multiple of :func:`get_pad_multiple`.
"""

from __future__ import annotations

import operator

import numpy as np
import torch
from megatron.core.datasets.blended_megatron_dataset_config import (
    convert_split_vector_to_split_matrix, parse_and_normalize_split,
)

from megatron.varlen.packing import parse_length_config
from megatron.varlen_training.config import RunConfig
from megatron.varlen_training.datasets.indexed import build_indexed_datasets
from megatron.varlen_training.datasets.indexed_checks import (
    SPLIT_NAMES, TEST, TRAIN, VALID, empty_split_fix, split_ranges,
)
from megatron.varlen_training.datasets.mock import MockGPTDataset, MockSFTDataset
from megatron.varlen_training.datasets.sample import get_pad_multiple
from megatron.varlen_training.datasets.sft import SFTDataset, sft_keys
from megatron.varlen_training.datasets.sft_arrow import ArrowSFTDataset, is_arrow_source
from megatron.varlen_training.datasets.whole_document_blend import build_whole_document_datasets
from megatron.varlen_training.document_arguments import PACKING_UNIT_DOCUMENT
from megatron.varlen_training.flag_ranges import GIB, host_memory_bytes
from megatron.varlen_training.log import warning_rank_0
from megatron.varlen_training.tokenizer import (
    HF_ROLE_MARKER_FORMAT, HuggingFaceTokenizer, NullTokenizer, Tokenizer,
)


VALID_SEED_OFFSET = 1_000_003  # mock validation seed = --seed + this
TEST_SEED_OFFSET = 2_000_003  # mock test seed = --seed + this
VALID_FRACTION = 0.05  # share of a real SFT file held out for validation
# Mock datasets keep (at least) one int64 length per sample they provide.
MOCK_BYTES_PER_SAMPLE = 8


class EpochDataset(torch.utils.data.Dataset):
    """``num_samples`` reads over ``doc_ids`` of ``dataset``, epoch after epoch.

    Read ``idx`` returns ``dataset[doc_ids[order_e[idx % n]]]`` with ``e = idx // n``, where
    ``order_e`` is a permutation seeded by ``(seed, e)`` when ``shuffle`` is set, else the
    identity; its ``sample_id`` is ``idx``.

    Args:
        dataset: Dataset to read from.
        doc_ids: Indices of ``dataset`` to use (non-empty).
        num_samples: Number of reads this dataset provides.
        seed: Seed of the per-epoch permutations, non-negative.
        shuffle: Permute each epoch.
    """

    def __init__(self, dataset, doc_ids: np.ndarray, num_samples: int, seed: int, shuffle: bool):
        assert len(doc_ids) > 0, "EpochDataset needs at least one document"
        self._dataset = dataset
        self._doc_ids = np.asarray(doc_ids, dtype=np.int64)
        self._num_samples = num_samples
        self._seed = seed
        self._shuffle = shuffle
        self._cached_epoch = -1
        self._cached_order = self._doc_ids

    def __len__(self) -> int:
        return self._num_samples

    @property
    def source(self):
        """The dataset read from."""
        return self._dataset

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if not self._shuffle:
            return self._doc_ids
        if epoch != self._cached_epoch:
            rng = np.random.default_rng([self._seed, epoch])
            self._cached_order = rng.permutation(self._doc_ids)
            self._cached_epoch = epoch
        return self._cached_order

    def __getitem__(self, idx: int) -> dict:
        idx = operator.index(idx)
        if not 0 <= idx < len(self):
            raise IndexError(f"sample {idx} out of range [0, {len(self)})")
        epoch, position = divmod(idx, len(self._doc_ids))
        sample = self._dataset[int(self._epoch_order(epoch)[position])]
        sample["sample_id"] = idx
        return sample


def build_datasets(run: RunConfig, tokenizer: Tokenizer | None, *,
                   pad_to_multiple_of: int | None = None):
    """``(train_ds, valid_ds)`` of :func:`build_split_datasets` (callers without a test split
    to read)."""
    train, valid, _ = build_split_datasets(run, tokenizer, pad_to_multiple_of=pad_to_multiple_of)
    return train, valid


def build_split_datasets(run: RunConfig, tokenizer: Tokenizer | None, *,
                         pad_to_multiple_of: int | None = None):
    """Builds ``(train_ds, valid_ds, test_ds)`` as described in the module docstring.

    Args:
        run: Reads the data config (sources, sample counts), ``seq_length`` and ``vocab_size``,
            ``seed``, the parallel sizes and whether samples are packed.
        tokenizer: Supplies vocab size, eod and pad; ``None`` with mock data means
            ``NullTokenizer(run.model.vocab_size)``.
        pad_to_multiple_of: Overrides :func:`get_pad_multiple` of the parallel sizes (e.g. for
            dynamic CP, whose largest CP group exceeds ``--context-parallel-size``).

    Returns:
        ``(train_ds, valid_ds, test_ds)``; ``valid_ds`` is ``None`` when
        ``run.data.eval_samples`` is 0, ``test_ds`` when ``run.data.test_samples`` is 0 or the
        data has no test split.

    Raises:
        ValueError: Missing ``--data-path``, unsupported data flags, or sizes that do not fit.
    """
    parallel, model, data = run.parallel, run.model, run.data
    multiple = pad_to_multiple_of or get_pad_multiple(
        parallel.context_parallel_size, parallel.tensor_model_parallel_size,
        parallel.sequence_parallel
    )
    pad_to_seq_length = not run.packing.sequence_packing
    if pad_to_seq_length and model.seq_length % multiple:
        raise ValueError(
            f"--seq-length {model.seq_length} must be a multiple of {multiple} (2 x context "
            "parallel x tensor parallel with sequence parallel) without --sequence-packing"
        )
    if tokenizer is None:
        tokenizer = NullTokenizer(model.vocab_size)
    if model.vocab_size is not None and model.vocab_size < tokenizer.vocab_size:
        raise ValueError(
            f"--vocab-size {model.vocab_size} is smaller than the tokenizer's vocabulary "
            f"({tokenizer.vocab_size})"
        )
    if data.mock_data:
        build = _build_mock_sft if data.sft else _build_mock_gpt
    elif data.sft:
        build = _build_sft
    elif data.indexed:
        build = _build_indexed
    else:
        raise ValueError("no training data: pass --mock-data, --data-path or --train-data-path")
    return build(run, tokenizer, multiple, pad_to_seq_length)


def _build_indexed(run: RunConfig, tokenizer: Tokenizer, multiple: int,
                   pad_to_seq_length: bool):
    if run.data.packing_unit == PACKING_UNIT_DOCUMENT:
        return *build_whole_document_datasets(run, tokenizer, multiple), None
    return build_indexed_datasets(run.data, run.model.seq_length, run.training.seed, tokenizer,
                                  multiple, pad_to_seq_length)


def _build_mock_gpt(run: RunConfig, tokenizer: Tokenizer, multiple: int,
                    pad_to_seq_length: bool):
    def build(num_samples: int, seed: int) -> MockGPTDataset:
        return MockGPTDataset(
            num_samples,
            run.model.seq_length,
            tokenizer.vocab_size,
            seed,
            tokenizer.eod,
            pad=tokenizer.pad,
            pad_to_multiple_of=multiple,
        )

    return _train_and_valid(run, build)


def _build_mock_sft(run: RunConfig, tokenizer: Tokenizer, multiple: int,
                    pad_to_seq_length: bool):
    length_config = parse_length_config(run.data.sft_mock_dataset_config_json,
                                        run.model.seq_length)

    def build(num_samples: int, seed: int) -> MockSFTDataset:
        return MockSFTDataset(
            num_samples,
            run.model.seq_length,
            tokenizer.vocab_size,
            seed,
            tokenizer.eod,
            length_config,
            multiple,
            pad_to_seq_length,
            pad=tokenizer.pad,
        )

    return _train_and_valid(run, build)


def check_mock_sample_count(train_samples: int, eval_samples: int) -> None:
    """Mock datasets materialise a length per sample: refuse counts whose arrays cannot fit this
    machine's memory (a huge --train-iters would otherwise fail in numpy with a traceback).

    Raises:
        ValueError: one line naming the sample counts and the flags that make them.
    """
    need, limit = (train_samples + eval_samples) * MOCK_BYTES_PER_SAMPLE, host_memory_bytes()
    if need > limit:
        raise ValueError(
            f"--mock-data keeps one length per sample: {train_samples} training samples "
            f"(--train-iters x --global-batch-size) and {eval_samples} validation and test "
            f"samples (--eval-iters, every --eval-interval and at the end) take "
            f"{need / GIB:.1f} GiB, above this machine's {limit / GIB:.1f} GiB of memory (lower "
            f"--train-iters or --eval-iters)")


def _train_and_valid(run: RunConfig, build):
    """Mock (train, validation, test): one ``build(num_samples, seed)`` per split read."""
    data, seed = run.data, run.training.seed
    check_mock_sample_count(data.train_samples, data.eval_samples + data.test_samples)
    valid = build(data.eval_samples, seed + VALID_SEED_OFFSET) if data.eval_samples else None
    test = build(data.test_samples, seed + TEST_SEED_OFFSET) if data.test_samples else None
    return build(data.train_samples, seed), valid, test


def open_sft_data(path: str, tokenizer: Tokenizer, run: RunConfig, multiple: int,
                  pad_to_seq_length: bool):
    """``--sft --data-path path``: Parquet/Arrow (a ``.parquet`` or ``.arrow`` file, a folder
    of shards, a ``datasets.save_to_disk`` folder) or a JSONL file; the same keys, template and
    samples."""
    keys = sft_keys(run.data)
    if isinstance(tokenizer, HuggingFaceTokenizer) and not tokenizer.has_chat_template():
        # A base model's tokenizer: the conversation trains with markers no chat model uses.
        warning_rank_0("--sft: the --tokenizer-model tokenizer has no chat template; turns open "
                       "with this fork's plain markers (%r), tokenized as text. Give the "
                       "tokenizer a chat_template (tokenizer_config.json) to train in its "
                       "model's chat format", HF_ROLE_MARKER_FORMAT.format(role="user"))
    kind = ArrowSFTDataset if is_arrow_source(path) else SFTDataset
    return kind(path, tokenizer, run.model.seq_length, multiple, pad_to_seq_length, keys)


def _build_sft(run: RunConfig, tokenizer: Tokenizer, multiple: int, pad_to_seq_length: bool):
    data = run.data
    if not data.data_path:
        raise ValueError("--sft without --mock-data needs --data-path FILE.jsonl")
    full = open_sft_data(data.data_path[0], tokenizer, run, multiple, pad_to_seq_length)
    train_ids, valid_ids, test_ids = sft_split(
        data.data_path[0], len(full), data.split, data.eval_samples > 0, data.test_samples > 0)
    train = EpochDataset(full, train_ids, data.train_samples, run.training.seed, True)
    # --full-validation: one pass over the validation documents, each once
    valid_samples = len(valid_ids) if data.full_validation and valid_ids is not None \
        else data.eval_samples
    valid = None if valid_ids is None else EpochDataset(full, valid_ids, valid_samples, 0, False)
    test = None if test_ids is None else EpochDataset(full, test_ids, data.test_samples, 0, False)
    return train, valid, test


def sft_split(path: str, num_docs: int, split: str | None, validate: bool, test: bool = False
              ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """The training, validation and test samples (file positions) of an SFT file of
    ``num_docs``.

    With ``--split`` they are megatron-core's document ranges of the split (as for indexed
    data: ``[round(start x N), round(end x N))``; a test share is the test split, as Megatron-LM
    builds one); without it the last ``max(1, round(VALID_FRACTION x N))`` samples are the
    validation set and there is no test split. ``validate`` / ``test`` False (no samples of that
    split are read) return None for it; so does a test share of 0.
    """
    if split is None:
        num_valid = max(1, round(VALID_FRACTION * num_docs)) if validate else 0
        if num_valid >= num_docs:
            raise ValueError(f"--data-path {path!r} has {num_docs} sample(s): too few to hold "
                             "out a validation tail (set --eval-iters 0 or add samples)")
        ranges = [(0, num_docs - num_valid), (num_docs - num_valid, num_docs), None]
    else:
        ranges = split_ranges(num_docs, convert_split_vector_to_split_matrix(
            parse_and_normalize_split(split)))
    train, valid = ranges[0], ranges[1] if validate else None
    test_range = ranges[2] if test else None
    read = [TRAIN] + ([VALID] if validate else []) + ([TEST] if test_range is not None else [])
    for split_index in read:
        _require_samples(ranges[split_index], split_index, path, split, num_docs, read)
    return tuple(None if bounds is None else np.arange(*bounds)
                 for bounds in (train, valid, test_range))


def _require_samples(bounds: tuple[int, int] | None, split_index: int, path: str, split: str,
                     num_docs: int, read: list[int]) -> None:
    if bounds is not None and bounds[1] > bounds[0]:
        return
    raise ValueError(f"--split {split!r} leaves the {SPLIT_NAMES[split_index]} split of {path} "
                     f"empty ({num_docs} samples in all): "
                     + empty_split_fix(split, np.ones(num_docs, dtype=np.int64), split_index,
                                       read, unit="samples"))
