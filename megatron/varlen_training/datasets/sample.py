"""The sample format every dataset returns, and the helpers that build and batch it.

A document is a sequence of ``L + 1`` ids (``L >= 1``). Its sample is a fresh dict::

    tokens         LongTensor[P]   document[:L], then pad
    labels         LongTensor[P]   document[1:L + 1] (the next token), then pad
    loss_mask      FloatTensor[P]  1.0 where the label is trained on, 0.0 elsewhere and on padding
    position_ids   LongTensor[P]   0 .. P - 1
    length         int             L, the real length
    padded_length  int             P = roundup(L, pad_to_multiple_of), or seq_length when padded
                                   to the sequence length (the unpacked baseline)
    sample_id      int             the index the sample was read at
    num_loss_tokens int            loss_mask.sum(); 0 flags a fully masked sample

Padding positions hold the tokenizer's pad id in tokens and labels. ``P`` is a multiple of the
divisor context and sequence parallelism need (:func:`get_pad_multiple`), so every CP chunk of
every sequence is non-empty and equal in size.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from megatron.varlen.scheduling import pad_multiple

COLLATED_KEYS = ("tokens", "labels", "loss_mask", "position_ids")
ATTENTION_MASK_KEY = "attention_mask"  # optional: [1, s, s] bool per sample, True = masked
SAMPLE_KEYS = COLLATED_KEYS + (
    "length",
    "padded_length",
    "sample_id",
    "num_loss_tokens",
)


def roundup(value: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is ``>= value``.

    >>> roundup(5, 4)
    8
    """
    return -(-value // multiple) * multiple


def get_pad_multiple(cp_size: int, tp_size: int, sequence_parallel: bool) -> int:
    """Divisor every padded sample length must have.

    Context parallelism cuts each sequence into ``2 * cp`` equal chunks; sequence parallelism
    splits each chunk's tokens over the TP ranks. Under dynamic CP pass the largest CP group size
    a sequence may get as ``cp_size``.

    Args:
        cp_size: Context-parallel size (1 = off).
        tp_size: Tensor-parallel size.
        sequence_parallel: Whether sequence parallelism is on.

    Returns:
        ``2 * cp * (tp if sequence_parallel else 1)``, or ``tp if sequence_parallel else 1``
        when ``cp == 1``.
    """
    if cp_size < 1 or tp_size < 1:
        raise ValueError(
            f"--context-parallel-size {cp_size} and --tensor-model-parallel-size {tp_size} "
            "must be >= 1"
        )
    return pad_multiple(cp_size, tp_size if sequence_parallel else 1)


def make_sample(
    document: np.ndarray,
    is_target: np.ndarray | None,
    sample_id: int,
    pad_id: int,
    pad_to_multiple_of: int = 1,
    padded_length: int | None = None,
) -> dict:
    """Builds a sample dict (module docstring) from one document.

    Args:
        document: ``L + 1`` token ids, ``L >= 1``.
        is_target: Per-id bool flags of ``document`` (same length): whether the id is trained
            on when it is the label. ``None`` trains on every label.
        sample_id: Index the sample was read at.
        pad_id: Id written to tokens and labels on padding positions.
        pad_to_multiple_of: The padded length is the real length rounded up to this.
        padded_length: Exact padded length instead (``>= L``), e.g. the sequence length.

    Returns:
        A new dict whose tensors share no memory with ``document`` or any other sample.
    """
    length = len(document) - 1
    assert pad_to_multiple_of >= 1, f"pad_to_multiple_of must be >= 1, got {pad_to_multiple_of}"
    assert length >= 1, f"a document needs at least 2 ids, got {len(document)}"
    if padded_length is None:
        padded_length = roundup(length, pad_to_multiple_of)
    assert padded_length >= length, f"padded length {padded_length} < real length {length}"
    doc = torch.as_tensor(document, dtype=torch.long)
    tokens = torch.full((padded_length,), pad_id, dtype=torch.long)
    labels = torch.full((padded_length,), pad_id, dtype=torch.long)
    loss_mask = torch.zeros(padded_length, dtype=torch.float)
    tokens[:length] = doc[:-1]
    labels[:length] = doc[1:]
    loss_mask[:length] = 1.0 if is_target is None else torch.as_tensor(is_target[1:])
    return {
        "tokens": tokens,
        "labels": labels,
        "loss_mask": loss_mask,
        "position_ids": torch.arange(padded_length, dtype=torch.long),
        "length": length,
        "padded_length": padded_length,
        "sample_id": int(sample_id),
        "num_loss_tokens": int(loss_mask.sum().item()),
    }


def collate_padded(samples: Sequence[dict]) -> dict:
    """Stacks samples of one padded length into ``[b, s]`` tensors (the unpacked path).

    Args:
        samples: Sample dicts that all have the same ``padded_length``.

    Returns:
        ``{"tokens", "labels", "loss_mask", "position_ids"}`` each of shape ``[b, s]``, and
        ``attention_mask`` ``[b, 1, s, s]`` when the samples carry one (``--reset-attention-mask``).

    Raises:
        ValueError: No samples, or samples of different padded lengths.
    """
    if not samples:
        raise ValueError("collate_padded: got no samples")
    padded_lengths = sorted({s["padded_length"] for s in samples})
    if len(padded_lengths) > 1:
        raise ValueError(
            f"collate_padded: samples have different padded lengths {padded_lengths}; pad them "
            "to --seq-length (no --sequence-packing) or pack them (--sequence-packing)"
        )
    keys = COLLATED_KEYS + ((ATTENTION_MASK_KEY,) if ATTENTION_MASK_KEY in samples[0] else ())
    return {key: torch.stack([s[key] for s in samples]) for key in keys}
