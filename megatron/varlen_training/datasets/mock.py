"""Mock datasets of random token ids, for ``--mock-data`` (fixed length) and
``--mock-data --sft`` (lengths drawn from ``--sft-mock-dataset-config-json``).

Sample ``idx`` is a pure function of ``(seed, idx)``: its ids come from a numpy generator
seeded with both, so any index can be read alone, in any order, on any rank. A document is
``L`` random ids that are never eod, followed by eod, so the last label is always eod. All ids
are ``< vocab_size`` (upstream's mock generator could exceed it).
"""

from __future__ import annotations

import operator

import numpy as np
import torch

from megatron.varlen_training.datasets.sample import make_sample
from megatron.varlen_training.log import warning_rank_0


MIN_MOCK_VOCAB_SIZE = 2  # one content id plus eod


def _check_mock_args(num_samples: int, seq_length: int, vocab_size: int, seed: int, eod: int):
    if vocab_size < MIN_MOCK_VOCAB_SIZE:
        raise ValueError(f"mock data needs --vocab-size >= {MIN_MOCK_VOCAB_SIZE}, got {vocab_size}")
    if not 0 <= eod < vocab_size:
        raise ValueError(f"mock data: eod id {eod} is not in [0, --vocab-size {vocab_size})")
    if seq_length < 1 or num_samples < 0 or seed < 0:
        raise ValueError(
            f"mock data needs --seq-length >= 1 (got {seq_length}), a sample count >= 0 "
            f"(got {num_samples}) and --seed >= 0 (got {seed})"
        )


def random_document(seed: int, idx: int, length: int, vocab_size: int, eod: int) -> np.ndarray:
    """``length`` random non-eod ids ``< vocab_size`` then eod, determined by ``(seed, idx)``."""
    rng = np.random.default_rng([seed, idx])
    ids = rng.integers(0, vocab_size - 1, size=length, dtype=np.int64)
    ids[ids >= eod] += 1  # skip eod: ids cover [0, vocab_size) without it
    return np.append(ids, np.int64(eod))


class _RandomDocumentDataset(torch.utils.data.Dataset):
    """Random documents of given real lengths; see the module docstring."""

    def __init__(
        self,
        lengths: np.ndarray,
        vocab_size: int,
        seed: int,
        eod: int,
        pad: int,
        pad_to_multiple_of: int,
        padded_length: int | None,
    ):
        if not 0 <= pad < vocab_size:
            raise ValueError(f"mock data: pad id {pad} is not in [0, --vocab-size {vocab_size})")
        self.lengths = lengths
        self._vocab_size = vocab_size
        self._seed = seed
        self._eod = eod
        self._pad = pad
        self._pad_to_multiple_of = pad_to_multiple_of
        self._padded_length = padded_length

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, idx: int) -> dict:
        idx = operator.index(idx)
        if not 0 <= idx < len(self):
            raise IndexError(f"sample {idx} out of range [0, {len(self)})")
        length = int(self.lengths[idx])
        document = random_document(self._seed, idx, length, self._vocab_size, self._eod)
        return make_sample(
            document,
            None,
            idx,
            self._pad,
            self._pad_to_multiple_of,
            self._padded_length,
        )


class MockGPTDataset(_RandomDocumentDataset):
    """``num_samples`` random documents of real length ``seq_length`` (``--mock-data``).

    Args:
        num_samples: Number of samples.
        seq_length: Real length of every sample (``--seq-length``).
        vocab_size: Ids are ``< vocab_size``.
        seed: Base seed (``--seed``), non-negative.
        eod: End-of-document id; ends every document and never appears elsewhere.
        pad: Padding id; defaults to ``eod``.
        pad_to_multiple_of: The padded length is ``seq_length`` rounded up to this.
    """

    def __init__(
        self,
        num_samples: int,
        seq_length: int,
        vocab_size: int,
        seed: int,
        eod: int,
        *,
        pad: int | None = None,
        pad_to_multiple_of: int = 1,
    ):
        _check_mock_args(num_samples, seq_length, vocab_size, seed, eod)
        lengths = np.full(num_samples, seq_length, dtype=np.int64)
        pad = eod if pad is None else pad
        super().__init__(lengths, vocab_size, seed, eod, pad, pad_to_multiple_of, None)


class MockSFTDataset(_RandomDocumentDataset):
    """Random documents whose real lengths follow a length config (``--mock-data --sft``).

    Lengths are ``length_config.sample(num_samples, seed)`` clipped to ``[1, seq_length]``; the
    number of clipped lengths is logged once. Every real token is trained on (loss_mask 1).

    Args:
        num_samples: Number of samples.
        seq_length: Longest real length (``--seq-length``).
        vocab_size: Ids are ``< vocab_size``.
        seed: Base seed (``--seed``), non-negative; also seeds the length draw.
        eod: End-of-document id; ends every document and never appears elsewhere.
        length_config: Object with ``sample(num_samples, seed) -> int64 array`` (a
            ``megatron.varlen.packing.length_distributions.LengthConfig``).
        pad_to_multiple_of: The padded length is the real length rounded up to this.
        pad_to_seq_length: Pad every sample to exactly ``seq_length`` instead (unpacked runs).
        pad: Padding id; defaults to ``eod``.
    """

    def __init__(
        self,
        num_samples: int,
        seq_length: int,
        vocab_size: int,
        seed: int,
        eod: int,
        length_config,
        pad_to_multiple_of: int = 1,
        pad_to_seq_length: bool = False,
        *,
        pad: int | None = None,
    ):
        _check_mock_args(num_samples, seq_length, vocab_size, seed, eod)
        drawn = np.asarray(length_config.sample(num_samples, seed), dtype=np.int64)
        assert drawn.shape == (num_samples,), f"length config returned shape {drawn.shape}"
        lengths = np.clip(drawn, 1, seq_length)
        self.num_clipped = int(np.count_nonzero(lengths != drawn))
        if self.num_clipped:
            warning_rank_0(
                "MockSFTDataset: %d of %d sampled lengths were outside [1, --seq-length %d] "
                "and were clipped",
                self.num_clipped,
                num_samples,
                seq_length,
            )
        pad = eod if pad is None else pad
        padded_length = seq_length if pad_to_seq_length else None
        super().__init__(lengths, vocab_size, seed, eod, pad, pad_to_multiple_of, padded_length)
