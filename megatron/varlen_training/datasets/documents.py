"""Documents inside pretraining samples: Megatron-LM's reset flags and document-level packing.

A pretraining sample is a window of ``--seq-length`` tokens cut from the concatenated documents
of the corpus; each document ends with the end-of-document id (eod). Megatron-LM separates the
documents of a sample with three flags, which this module implements for the UNPACKED path with
Megatron-LM's semantics (megatron-core's ``gpt_dataset._get_ltor_masks_and_position_ids``):

- ``--reset-position-ids``: positions restart at 0 after every eod INPUT token;
- ``--reset-attention-mask``: a token after an eod at position i never attends to positions
  ``<= i`` (a dense per-sample ``[1, s, s]`` mask, True = masked, Megatron's convention);
- ``--eod-mask-loss``: no loss where the INPUT token is eod (predicting the next document's
  first token from the previous document); the eod as a LABEL is still trained.

So a sample's document pieces are the spans that end just after each eod input token (the eod
belongs to the document it ends) plus the rest of the sample. With ``--sequence-packing`` and
``--reset-attention-mask`` the packed path makes every piece its own THD sequence
(:func:`split_documents`) instead of a mask: positions restart and attention cannot cross a
piece by construction, and the loss mask is the sample's, so the packed run trains exactly the
tokens the unpacked run with the three flags trains. Without it a packed sample stays whole.

Shape legend: ``s`` = the sample's padded length, ``L`` = its real length (tokens ``[0, L)``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from megatron.varlen_training.datasets.sample import roundup


@dataclass(frozen=True)
class DocumentResets:
    """Megatron-LM's three document flags (field names are the flags' dests)."""

    reset_position_ids: bool = False
    reset_attention_mask: bool = False
    eod_mask_loss: bool = False

    @property
    def any(self) -> bool:
        return self.reset_position_ids or self.reset_attention_mask or self.eod_mask_loss


def document_spans(tokens: torch.Tensor, length: int, eod: int) -> list[tuple[int, int]]:
    """Half-open ``[start, end)`` spans of the documents in ``tokens[:length]``.

    A span ends just after each eod input token; the last span ends at ``length``. Spans are
    non-empty and cover ``[0, length)`` exactly once.

    >>> document_spans(torch.tensor([5, 9, 1, 6, 9, 7]), 6, eod=9)
    [(0, 2), (2, 5), (5, 6)]
    """
    ends = (torch.nonzero(tokens[:length] == eod).flatten() + 1).tolist()
    if not ends or ends[-1] != length:
        ends.append(length)
    starts = [0] + ends[:-1]
    return list(zip(starts, ends))


def mask_eod_loss(sample: dict, eod: int) -> dict:
    """``--eod-mask-loss``: a copy of ``sample`` with no loss where the input token is eod."""
    loss_mask = sample["loss_mask"].masked_fill(sample["tokens"] == eod, 0.0)
    return {**sample, "loss_mask": loss_mask, "num_loss_tokens": int(loss_mask.sum().item())}


def reset_positions(sample: dict, eod: int) -> torch.Tensor:
    """``--reset-position-ids``: positions counted from each document's start (``[s]``).

    Like Megatron-LM, every eod of the whole tensor restarts the count, padding included (a
    pad id equal to eod puts padding at position 0).
    """
    size = sample["tokens"].numel()
    positions = torch.arange(size, dtype=torch.long)
    for start, _ in document_spans(sample["tokens"], size, eod)[1:]:
        positions[start:] = torch.arange(positions.numel() - start, dtype=torch.long)
    return positions


def document_attention_mask(sample: dict, eod: int) -> torch.Tensor:
    """``--reset-attention-mask``: ``[1, s, s]`` bool, True where query i may NOT see key j.

    Causal, and a query never sees a key of an earlier document. Megatron-LM cuts at every eod
    input token, so the padding after the real tokens is one more block (it is never trained).
    """
    size = sample["tokens"].numel()
    document_of = torch.zeros(size, dtype=torch.long)
    spans = document_spans(sample["tokens"], size, eod)
    for index, (start, end) in enumerate(spans):
        document_of[start:end] = index
    key_after_query = torch.ones(size, size, dtype=torch.bool).triu(diagonal=1)
    other_document = document_of[:, None] != document_of[None, :]
    return (key_after_query | other_document).unsqueeze(0)


def apply_document_resets(sample: dict, eod: int, resets: DocumentResets) -> dict:
    """The unpacked path's sample under Megatron-LM's flags (a new dict; see module docstring).

    Adds ``attention_mask`` ``[1, s, s]`` with ``--reset-attention-mask``.
    """
    if resets.eod_mask_loss:
        sample = mask_eod_loss(sample, eod)
    if resets.reset_position_ids:
        sample = {**sample, "position_ids": reset_positions(sample, eod)}
    if resets.reset_attention_mask:
        sample = {**sample, "attention_mask": document_attention_mask(sample, eod)}
    return sample


def split_documents(sample: dict, eod: int, pad_id: int, pad_to_multiple_of: int = 1
                    ) -> list[dict]:
    """The packed path's view of a sample: one sample dict per document piece.

    Each piece keeps its slice of the sample's tokens, labels and loss mask (so the label of
    an eod input is the next document's first token, trained unless ``--eod-mask-loss`` masked
    it) with positions from 0; its padded length is its real length rounded up to
    ``pad_to_multiple_of``. Pieces keep the sample's ``sample_id`` and record
    ``document_start`` (their offset in the sample).
    """
    pieces = []
    for start, end in document_spans(sample["tokens"], sample["length"], eod):
        length = end - start
        padded = roundup(length, pad_to_multiple_of)
        loss_mask = _padded(sample["loss_mask"][start:end], padded, 0.0)
        pieces.append({
            "tokens": _padded(sample["tokens"][start:end], padded, pad_id),
            "labels": _padded(sample["labels"][start:end], padded, pad_id),
            "loss_mask": loss_mask,
            "position_ids": torch.arange(padded, dtype=torch.long),
            "length": length,
            "padded_length": padded,
            "sample_id": sample["sample_id"],
            "num_loss_tokens": int(loss_mask.sum().item()),
            "document_start": start,
        })
    return pieces


def _padded(values: torch.Tensor, length: int, fill) -> torch.Tensor:
    out = torch.full((length,), fill, dtype=values.dtype)
    out[: values.numel()] = values
    return out


def document_lengths(samples: list[dict], eod: int) -> list[int]:
    """Lengths of the document pieces of ``samples`` (model FLOPs count attention per document
    when documents do not attend to each other)."""
    return [end - start for sample in samples
            for start, end in document_spans(sample["tokens"], sample["length"], eod)]


def document_resets(data) -> DocumentResets:
    """The run's document flags (``data``: a ``DataConfig``)."""
    return DocumentResets(data.reset_position_ids, data.reset_attention_mask, data.eod_mask_loss)


def unpacked_transform(resets: DocumentResets, eod: int):
    """The unpacked path's per-sample transform for ``resets`` (None when no flag is set)."""
    if not resets.any:
        return None
    return lambda sample: apply_document_resets(sample, eod, resets)


def unpacked_attention_lengths(resets: DocumentResets, eod: int):
    """The lengths FLOPs count attention over on the unpacked path: the documents' when they
    do not attend to each other (``--reset-attention-mask``), else None (the samples')."""
    if not resets.reset_attention_mask:
        return None
    return lambda samples: document_lengths(samples, eod)


def packed_document_split(resets: DocumentResets, eod: int, pad_id: int):
    """The packed path's sample -> the sequences packed (None: the sample whole, unchanged).

    ``--reset-attention-mask``: the sample's document pieces, each its own THD sequence (its
    positions restart, so with learned positions ``--reset-position-ids`` goes with it: the
    flag layer insists); without it the sample stays one sequence, attending across its
    documents as the unpacked run does. ``--eod-mask-loss`` applies either way.
    """
    if not (resets.reset_attention_mask or resets.eod_mask_loss):
        return None

    def split(sample: dict) -> list[dict]:
        if resets.eod_mask_loss:
            sample = mask_eod_loss(sample, eod)
        if not resets.reset_attention_mask:
            return [sample]
        return split_documents(sample, eod, pad_id)

    return split
