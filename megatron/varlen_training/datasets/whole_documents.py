"""Whole documents as samples (``--sequence-packing --packing-unit document``).

Megatron-LM cuts the concatenated documents into ``--seq-length`` samples, so a long document is
cut at arbitrary sample boundaries and its second part starts without its context. Long-context
training wants documents whole: here a sample is ONE document (its ids, eod included, as the
preprocessing wrote them), packed as its own THD sequence, never cut at ``--seq-length``. Only a
document longer than the longest sequence the layout can run (:func:`longest_sequence`) is cut,
into consecutive pieces of at most that many tokens (or of ``--document-piece-length``, at most
that: :func:`document_piece_length`).

Definitions (docs/PACKING.md):

- a document of ``n`` ids gives ``L = n - 1`` training tokens (inputs ``ids[:-1]``, labels
  ``ids[1:]``: its first id is never a label, its eod never an input); a document of one id
  gives none and is skipped (counted);
- a *piece* is a document, or one part of a cut one (a part's labels continue where the previous
  part's stopped, so every label of the document is in exactly one piece);
- a *sample* is a piece: ``--global-batch-size`` counts pieces, ``--train-iters x
  --global-batch-size`` reads are made;
- an *epoch* is every piece of the split once, in an order permuted with ``(--seed, epoch)``;
  reads continue epoch after epoch, so every token of every document trains exactly once per
  epoch.

Sample ``i`` is a pure function of ``(seed, i)``: any rank reads any index, and a resumed run
continues the same stream from its iteration. A blend of several datasets reads each through
its own :class:`WholeDocumentDataset` (:mod:`.whole_document_blend`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import numpy as np
import torch

from megatron.varlen_training.datasets.sample import make_sample
from megatron.varlen_training.log import print_rank_0
from megatron.varlen_training.varlen_arguments import sequence_cp_sizes
from megatron.varlen.scheduling import pad_multiple

ReadDocument = Callable[[int], np.ndarray]


def longest_sequence(budget: int, cp_sizes: list[int], sp_factor: int,
                     max_positions: int | None = None) -> int:
    """The most real tokens one sequence may have on the layout: on its largest CP group ``c``,
    padded to that group's multiple, it must fit ``budget`` tokens per rank; with learned
    absolute positions also ``max_positions`` (the position table's rows)."""
    longest = 0
    for cp in cp_sizes:
        multiple = pad_multiple(cp, sp_factor)
        longest = max(longest, budget * cp // multiple * multiple)
    return longest if max_positions is None else min(longest, max_positions)


def run_longest_sequence(run) -> int:
    """:func:`longest_sequence` of a ``RunConfig`` (its budget, CP group sizes, positions)."""
    packing, parallel, model = run.packing, run.parallel, run.model
    cp_sizes = sequence_cp_sizes(parallel.dp_cp_size, parallel.context_parallel_size,
                                 packing.min_dynamic_context_parallel_size,
                                 packing.dynamic_context_parallel)
    learned = model.position_embedding_type == "learned_absolute"
    return longest_sequence(packing.max_seqlen_per_dp_cp_rank, cp_sizes, parallel.sp_factor,
                            model.max_position_embeddings if learned else None)


def document_piece_length(run) -> int:
    """The most training tokens a piece of a ``RunConfig``'s documents has:
    ``--document-piece-length`` (a resume on a layout that runs longer sequences keeps its
    checkpoint's pieces with it; argument checks hold it to the layout's longest), else the
    layout's longest sequence."""
    return run.data.document_piece_length or run_longest_sequence(run)


def piece_table(num_ids: np.ndarray, max_length: int) -> tuple[np.ndarray, np.ndarray,
                                                               np.ndarray]:
    """``(document, offset, length)`` of every piece, in document order.

    Args:
        num_ids: ids of each document (its tokens and eod).
        max_length: most training tokens a piece may have (>= 1).

    A document of ``n`` ids has ``n - 1`` training tokens, cut into ``ceil((n - 1) / max_length)``
    pieces; piece ``k`` reads ids ``[offset, offset + length + 1)``.
    """
    assert max_length >= 1, max_length
    tokens = np.maximum(np.asarray(num_ids, dtype=np.int64) - 1, 0)
    num_pieces = -(-tokens // max_length)
    document = np.repeat(np.arange(len(tokens), dtype=np.int64), num_pieces)
    first_piece = np.cumsum(num_pieces) - num_pieces
    index_in_document = np.arange(len(document), dtype=np.int64) - first_piece[document]
    offset = index_in_document * max_length
    length = np.minimum(tokens[document] - offset, max_length)
    return document, offset, length


class WholeDocumentDataset(torch.utils.data.Dataset):
    """``num_samples`` reads over the pieces of the documents ``doc_ids`` (module docstring).

    Args:
        read_document: document id -> its ids (e.g. megatron-core's ``IndexedDataset``).
        num_ids: ids of each document in ``doc_ids`` (same order).
        doc_ids: the split's document ids.
        num_samples: reads this dataset provides.
        max_length: longest piece, in training tokens (:func:`longest_sequence`).
        seed: seed of the per-epoch permutations.
        pad_id: padding id; pieces are padded to ``pad_to_multiple_of``.
        stream: the dataset's place in a blend, part of the permutations' seed material so that
            each dataset of a blend has an order of its own; 0 (a run on one dataset, or a
            blend's first) keeps ``(seed, epoch)``, the order runs read before blends existed.
        name: what the start-up line calls the dataset (its prefix), if anything.
    """

    def __init__(self, read_document: ReadDocument, num_ids: np.ndarray, doc_ids: np.ndarray,
                 num_samples: int, max_length: int, seed: int, pad_id: int,
                 pad_to_multiple_of: int = 1, *, stream: int = 0, name: str | None = None):
        document, self._offset, self._length = piece_table(num_ids, max_length)
        of = f" of {name}" if name else ""
        if len(document) == 0:
            raise ValueError(f"--packing-unit document: none of the split's {len(doc_ids)} "
                             f"documents{of} has a token to train on (each needs >= 2 ids)")
        self._document = np.asarray(doc_ids, dtype=np.int64)[document]
        self._read = read_document
        self._num_samples, self._seed, self._stream = num_samples, seed, stream
        self._pad_id, self._multiple = pad_id, pad_to_multiple_of
        self._cached_epoch, self._cached_order = -1, None
        num_cut = int(np.count_nonzero(np.asarray(num_ids) - 1 > max_length))
        num_skipped = int(np.count_nonzero(np.asarray(num_ids) < 2))
        print_rank_0(f"> whole documents{of}: {len(self._document)} pieces per epoch from "
                     f"{len(doc_ids)} documents ({num_cut} longer than the longest piece, "
                     f"{max_length} tokens, cut; {num_skipped} without a training token "
                     f"skipped)")

    @property
    def pieces_per_epoch(self) -> int:
        return len(self._document)

    @property
    def tokens_per_epoch(self) -> int:
        """Training tokens of one epoch: every piece's length once."""
        return int(self._length.sum())

    def __len__(self) -> int:
        return self._num_samples

    def _order(self, epoch: int) -> np.ndarray:
        if epoch != self._cached_epoch:
            material = [self._seed, epoch] + ([self._stream] if self._stream else [])
            rng = np.random.default_rng(material)
            self._cached_order = rng.permutation(len(self._document))
            self._cached_epoch = epoch
        return self._cached_order

    def piece(self, idx: int) -> tuple[int, int, int]:
        """``(document id, offset, length)`` read at ``idx``."""
        epoch, position = divmod(idx, len(self._document))
        k = int(self._order(epoch)[position])
        return int(self._document[k]), int(self._offset[k]), int(self._length[k])

    def __getitem__(self, idx: int) -> dict:
        idx = operator.index(idx)
        if not 0 <= idx < len(self):
            raise IndexError(f"sample {idx} out of range [0, {len(self)})")
        return make_sample(self.piece_ids(idx), None, idx, self._pad_id, self._multiple)

    def piece_ids(self, idx: int) -> np.ndarray:
        """The ids (int64) of the piece read at ``idx``: its tokens and the label after them."""
        document, offset, length = self.piece(idx)
        ids = np.asarray(self._read(document))[offset: offset + length + 1]
        return ids.astype(np.int64)
