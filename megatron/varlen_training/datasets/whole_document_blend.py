"""Whole documents of a blend of indexed datasets (``--packing-unit document`` with
``--data-path 0.7 A 0.3 B``, or several prefixes in a per-split path).

Megatron-LM's blend weights are shares of samples, and its samples are ``--seq-length`` tokens
each, so they are shares of tokens. A whole-document sample holds as many tokens as its piece
(:mod:`.whole_documents`), so here the weights stay shares of training TOKENS: dataset ``d`` is
drawn with a per-sample probability proportional to ``w_d / mean_d`` (``mean_d``: the mean
training tokens per piece of d's split, exact from its piece table), and in expectation each
dataset gives its weight's share of the tokens. Without weights megatron-core weighs each
dataset by its size; here its size is its split's training tokens, so each dataset is drawn in
proportion to its pieces and every epoch of the blend reads each dataset about once.

Which dataset sample ``i`` comes from is megatron-core's own blending
(``helpers_cpp.build_blending_indices``, what its ``BlendedDataset`` runs): sample ``i`` goes to
the dataset furthest behind its share of the first ``i`` samples. It depends only on the
weights and ``i``, so a longer run extends the stream and a resumed run continues it. Dataset
``d``'s ``k``-th sample is read ``k`` of its own :class:`WholeDocumentDataset`, whose epochs
have a permutation stream of their own (``stream=d``): a blend of one dataset reads exactly
what a run on that dataset alone reads.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import numpy as np
import torch
from megatron.core.datasets import helpers_cpp
from megatron.core.datasets.utils import Split

from megatron.varlen_training.datasets import indexed, indexed_checks
from megatron.varlen_training.datasets.blending_cache import cached_blending_indices
from megatron.varlen_training.datasets.sample import make_sample
from megatron.varlen_training.datasets.whole_documents import (
    WholeDocumentDataset,
    document_piece_length,
)
from megatron.varlen_training.errors import agree_on_errors
from megatron.varlen_training.log import print_rank_0

# megatron-core's dataset index dtype (BlendedDataset, helpers_cpp.build_blending_indices).
DATASET_INDEX_DTYPE = np.int16


def sample_weights(token_weights: Sequence[float], mean_lengths: Sequence[float]) -> np.ndarray:
    """Per-sample probabilities (summing to 1) that give dataset ``d`` the share
    ``token_weights[d] / sum(token_weights)`` of the training tokens in expectation, when its
    samples hold ``mean_lengths[d]`` tokens on average: ``w_d / mean_d``, normalised."""
    per_sample = np.asarray(token_weights, dtype=np.float64) / np.asarray(mean_lengths,
                                                                          dtype=np.float64)
    return per_sample / per_sample.sum()


def blending_indices(weights: np.ndarray, num_samples: int) -> tuple[np.ndarray, np.ndarray]:
    """megatron-core's ``(dataset index, sample index within that dataset)`` of every sample for
    the per-sample ``weights`` (summing to 1), as its ``BlendedDataset`` builds them."""
    dataset_index = np.zeros(num_samples, dtype=DATASET_INDEX_DTYPE)
    dataset_sample_index = np.zeros(num_samples, dtype=np.int64)
    helpers_cpp.build_blending_indices(dataset_index, dataset_sample_index,
                                       np.asarray(weights, dtype=np.float64), len(weights),
                                       num_samples, False)
    return dataset_index, dataset_sample_index


class WholeDocumentBlend(torch.utils.data.Dataset):
    """``num_samples`` whole-document samples drawn from ``datasets`` (module docstring).

    Args:
        datasets: one :class:`WholeDocumentDataset` per dataset of the blend, each able to
            read as many samples as this blend draws from it.
        token_weights: each dataset's weight, a share of the training tokens (need not sum to
            1); None: each dataset's training tokens per epoch (megatron-core's unweighted
            blend weighs by size).
        num_samples: samples of the split.
        pad_id, pad_to_multiple_of: as :class:`WholeDocumentDataset`'s.
        names: what the start-up lines call the datasets (their prefixes).
        cache_dir: ``--data-cache-path``: where the sample-to-dataset table is saved once and
            memory-mapped from (:mod:`.blending_cache`); None: built in memory on every rank.
        split: the split's name, in the cache's file names.
    """

    def __init__(self, datasets: Sequence[WholeDocumentDataset],
                 token_weights: Sequence[float] | None, num_samples: int, pad_id: int,
                 pad_to_multiple_of: int = 1, names: Sequence[str] | None = None, *,
                 cache_dir: str | None = None, split: str = "train"):
        self._datasets = list(datasets)
        self._num_samples = num_samples
        self._pad_id, self._multiple = pad_id, pad_to_multiple_of
        # One dataset: sample i is its read i (what megatron-core's blending gives a single
        # weight), without the 10 bytes per sample of the indices.
        self._dataset_index = self._sample_index = None
        if len(self._datasets) > 1:
            self._dataset_index, self._sample_index = self._blend(
                token_weights, names or [str(d) for d in range(len(datasets))], cache_dir,
                split)

    def _blend(self, token_weights: Sequence[float] | None, names: Sequence[str],
               cache_dir: str | None, split: str) -> tuple[np.ndarray, np.ndarray]:
        if token_weights is None:
            token_weights = [dataset.tokens_per_epoch for dataset in self._datasets]
        means = [dataset.tokens_per_epoch / dataset.pieces_per_epoch
                 for dataset in self._datasets]
        weights = sample_weights(token_weights, means)
        _log_blend(np.asarray(token_weights, dtype=np.float64), means, weights, names)
        return cached_blending_indices(blending_indices, weights, self._num_samples,
                                       cache_dir, split)

    def __len__(self) -> int:
        return self._num_samples

    def source(self, idx: int) -> tuple[int, int]:
        """``(dataset, its sample index)`` read at ``idx``."""
        if self._dataset_index is None:
            return 0, idx
        return int(self._dataset_index[idx]), int(self._sample_index[idx])

    def __getitem__(self, idx: int) -> dict:
        idx = operator.index(idx)
        if not 0 <= idx < len(self):
            raise IndexError(f"sample {idx} out of range [0, {len(self)})")
        dataset, sample = self.source(idx)
        ids = self._datasets[dataset].piece_ids(sample)
        return make_sample(ids, None, idx, self._pad_id, self._multiple)


def _log_blend(token_weights: np.ndarray, means: list[float], weights: np.ndarray,
               names: Sequence[str]) -> None:
    """One line per dataset, as megatron-core's blending logs ``dataset d, input: w``."""
    shares = token_weights / token_weights.sum()
    print_rank_0(f"> whole documents: a blend of {len(names)} datasets, weights are shares of "
                 f"training tokens")
    for index, name in enumerate(names):
        print_rank_0(f"    dataset {index}, weight: {shares[index]:.4f} of the tokens, mean "
                     f"piece: {means[index]:.1f} tokens, share of samples: "
                     f"{weights[index]:.4f} ({name})")


def build_whole_document_datasets(run, tokenizer, pad_to_multiple_of: int):
    """``(train, validation or None)`` of ``--packing-unit document`` over the run's indexed
    data: each split's blend (one dataset or several) of the documents megatron-core's builder
    assigns to it (``--split`` shares of every dataset, or the per-split paths), read with
    megatron-core's ``IndexedDataset``.

    Raises:
        ValueError: one line: a split without documents, or what the indexed-data checks refuse.
    """
    data, seed = run.data, run.training.seed
    config = indexed.gpt_dataset_config(data, run.model.seq_length, seed, tokenizer)
    sizes = indexed.split_sizes(data)
    agree_on_errors(indexed.check_indexed_data, config, data, sizes)
    max_length = document_piece_length(run)

    def build(split: int) -> WholeDocumentBlend | None:
        blend = config.blend if config.blend is not None else config.blend_per_split[split]
        if not sizes[split] or blend is None:
            return None
        prefixes, weights = blend
        datasets = [_split_documents(prefix, place, split, config, run, tokenizer, max_length,
                                     sizes[split], pad_to_multiple_of)
                    for place, prefix in enumerate(prefixes)]
        return WholeDocumentBlend(datasets, weights, sizes[split], tokenizer.pad,
                                  pad_to_multiple_of, prefixes, cache_dir=data.data_cache_path,
                                  split=Split(split).name)

    return build(0), build(1)


def _split_documents(prefix: str, place: int, split: int, config, run, tokenizer,
                     max_length: int, num_samples: int,
                     pad_to_multiple_of: int) -> WholeDocumentDataset:
    """The :class:`WholeDocumentDataset` of ``prefix``'s documents in ``split``, the
    ``place``-th dataset of its blend; it may be read up to ``num_samples`` times (the split's
    count bounds what the blend draws from one dataset)."""
    flag = "--data-path" if config.blend is not None else indexed.PER_SPLIT_FLAGS[split]
    core = indexed_checks.open_checked(prefix, tokenizer.vocab_size, config.mmap_bin_files, flag,
                                       run.data.tokenizer_type)
    begin, end = ((0, len(core)) if config.blend is None else
                  indexed_checks.split_ranges(len(core), config.split_matrix)[split])
    return WholeDocumentDataset(core.__getitem__, core.sequence_lengths[begin:end],
                                np.arange(begin, end), num_samples, max_length, run.training.seed,
                                tokenizer.pad, pad_to_multiple_of, stream=place, name=prefix)
