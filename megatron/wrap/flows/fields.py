"""Checks and conversions of the fields of user samples, with one-line errors.

Every error is a :class:`BatchError` (a ``ValueError``) that names the sample index, the field, the
bad value and the limit, e.g. ``sample 3, field 'tokens': id 130 at position 5 is not below the
vocabulary size 128 (config key 'vocab_size')``. The checks are pure functions of the sample, so
every rank that checks the same batch raises the same error (no rank is left waiting in a
collective).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from numbers import Integral, Real
from typing import Any

import numpy as np
import torch

from megatron.varlen_training.errors import UserInputError

VOCAB_KEY = "vocab_size"
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # what an int field's tensor (torch.long) holds


class BatchError(UserInputError):
    """A bad batch or sample given to ``train()`` / ``evaluate()``: a one-line ValueError;
    uncaught in a script, one line and exit code 2 (megatron/wrap/script_errors.py)."""


def sample_error(index: int, field: str | None, problem: str) -> BatchError:
    """The one-line error about ``field`` of sample ``index`` (``field`` None: the sample)."""
    where = f"sample {index}" if field is None else f"sample {index}, field {field!r}"
    return BatchError(f"{where}: {problem}")


def require_field(raw: Mapping, index: int, field: str, reads: str) -> Any:
    """``raw[field]``, or an error naming what the flow reads (``reads``)."""
    if field not in raw:
        raise sample_error(index, None, f"missing field {field!r} (this flow reads {reads}; "
                                        f"got {', '.join(map(repr, raw)) or 'no fields'})")
    return raw[field]


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _as_int_tensor(value: Any, index: int, field: str) -> torch.Tensor:
    """A 1-D int64 CPU tensor from a list of ints, a 1-D integer numpy array or tensor."""
    expected = "a list of ints or a 1-D integer tensor"
    if isinstance(value, (torch.Tensor, np.ndarray)):
        tensor = torch.as_tensor(value)
        if tensor.dim() != 1 or tensor.is_floating_point() or tensor.is_complex() \
                or tensor.dtype == torch.bool:
            raise sample_error(index, field, f"expected {expected}, got a {tensor.dim()}-D "
                                             f"{tensor.dtype} tensor")
        if tensor.dtype == torch.uint64:  # the int64 conversion would wrap these to negatives
            values = tensor.detach().cpu().numpy()
            too_large = np.flatnonzero(values > INT64_MAX)
            if too_large.size:
                position = int(too_large[0])
                raise sample_error(index, field, f"item {position} is {int(values[position])}, "
                                                 f"outside the int64 range [-2**63, 2**63)")
        return tensor.detach().to("cpu", torch.long)
    if not isinstance(value, (list, tuple)):
        raise sample_error(index, field, f"expected {expected}, got {type(value).__name__} "
                                         f"{_describe(value)}")
    for position, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, Integral):
            raise sample_error(index, field, f"expected {expected}, but item {position} is "
                                             f"{type(item).__name__} {_describe(item)}")
        if not INT64_MIN <= item <= INT64_MAX:  # torch would fail with a bare ValueError
            raise sample_error(index, field, f"item {position} is {_describe(item)}, outside "
                                             f"the int64 range [-2**63, 2**63)")
    return torch.tensor([int(item) for item in value], dtype=torch.long)


def as_token_ids(value: Any, index: int, field: str, vocab_size: int) -> torch.Tensor:
    """Token ids as a 1-D int64 tensor, every id in ``[0, vocab_size)``.

    Args:
        value: A list/tuple of ints, or a 1-D integer numpy array or torch tensor.
        index: The sample's index in the batch (for the error).
        field: The field name (for the error).
        vocab_size: The tokenizer's vocabulary size (config key ``vocab_size``).

    Raises:
        ValueError: Wrong type, or an id outside the vocabulary.
    """
    ids = _as_int_tensor(value, index, field)
    bad = torch.nonzero((ids < 0) | (ids >= vocab_size)).flatten()
    if bad.numel():
        position = int(bad[0])
        raise sample_error(index, field, f"id {int(ids[position])} at position {position} is "
                                         f"outside [0, {vocab_size}) (the vocabulary size, "
                                         f"config key {VOCAB_KEY!r})")
    return ids


def as_per_token_values(value: Any, index: int, field: str) -> torch.Tensor:
    """Per-token numbers (a mask, weights, advantages) as a 1-D float32 tensor, all finite.

    Raises:
        ValueError: Not a flat list of numbers / 1-D real tensor, or a NaN/inf entry.
    """
    expected = "a list of numbers or a 1-D tensor"
    if isinstance(value, (torch.Tensor, np.ndarray)):
        tensor = torch.as_tensor(value)
        if tensor.dim() != 1 or tensor.is_complex():
            raise sample_error(index, field, f"expected {expected}, got a {tensor.dim()}-D "
                                             f"{tensor.dtype} tensor")
        values = tensor.detach().to("cpu", torch.float32)
    elif isinstance(value, (list, tuple)):
        for position, item in enumerate(value):
            if not isinstance(item, Real):
                raise sample_error(index, field, f"expected {expected}, but item {position} "
                                                 f"is {type(item).__name__} {_describe(item)}")
        values = torch.tensor([float(item) for item in value], dtype=torch.float32)
    else:
        raise sample_error(index, field, f"expected {expected}, got {type(value).__name__} "
                                         f"{_describe(value)}")
    bad = torch.nonzero(~torch.isfinite(values)).flatten()
    if bad.numel():
        position = int(bad[0])
        raise sample_error(index, field, f"value {float(values[position])} at position "
                                         f"{position} is not finite")
    return values


def as_scalar(value: Any, index: int, field: str) -> float:
    """A per-sample number (e.g. a reward) as a finite float."""
    if isinstance(value, (torch.Tensor, np.ndarray)) and np.size(value) == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise sample_error(index, field, f"expected a finite number, got {_describe(value)}")
    return float(value)


def as_length(value: Any, index: int, available: int) -> int:
    """The real length ``L`` of a sample whose tensors hold ``available`` entries."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise sample_error(index, "length", f"expected an int, got {_describe(value)}")
    if not 1 <= value <= available:
        raise sample_error(index, "length", f"{int(value)} is outside [1, {available}] (the "
                                            f"number of entries in 'tokens')")
    return int(value)


def require_binary(values: torch.Tensor, index: int, field: str) -> torch.Tensor:
    """``values`` if every entry is 0 or 1: the loss normalises by the count of 1s, so other
    values (negative, fractional) would train on a silently wrong loss."""
    bad = ((values != 0) & (values != 1)).nonzero()
    if bad.numel():
        position = int(bad[0, 0])
        raise sample_error(index, field, f"entry {position} is {float(values[position]):g}; "
                                         f"entries must be 0 or 1")
    return values


def require_entries(values: torch.Tensor, length: int, index: int, field: str,
                    padded_length: int | None = None) -> torch.Tensor:
    """The first ``length`` entries of ``values``, which must hold exactly one entry per token.

    ``values`` must have exactly ``length`` entries or, in the padded data-path form (a sample
    whose ``tokens`` hold ``padded_length`` entries of which the first ``length`` are real),
    exactly ``padded_length``. Any other count means the field is not aligned with the tokens
    (e.g. advantages computed for another tokenization): cutting a longer one to length would
    train on the wrong values without a word, so it is refused like a shorter one.

    Raises:
        ValueError: One line naming the sample, the field and both lengths.
    """
    allowed = {length} if padded_length is None else {length, padded_length}
    if values.numel() not in allowed:
        padded = "" if padded_length in (None, length) else \
            f" ({padded_length} entries with the padding of 'tokens')"
        raise sample_error(index, field, f"has {values.numel()} entries but the sample has "
                                         f"{length} tokens{padded}; give exactly one entry "
                                         f"per token")
    return values[:length]


def require_positions(value: Any, index: int, length: int, padded_length: int) -> None:
    """Checks ``position_ids`` (the datasets' field): the facade packs each sample as one
    sequence whose positions run ``0 .. length - 1``, so other positions (reset at documents,
    offset) would be replaced without a word; they are refused instead."""
    positions = _as_int_tensor(value, index, "position_ids")
    positions = require_entries(positions, length, index, "position_ids", padded_length)
    wrong = torch.nonzero(positions != torch.arange(length)).flatten()
    if wrong.numel():
        position = int(wrong[0])
        raise sample_error(index, "position_ids", f"entry {position} is {int(positions[position])}"
                                                  f", not {position}: each sample is packed as "
                                                  f"one sequence with positions 0..length-1; "
                                                  f"drop the field, or give each document as a "
                                                  f"sample of its own")


def refuse_unread(raw: Mapping, index: int, reads: Sequence[str], accepted: Sequence[str],
                  flow: str, ignored_key: str) -> None:
    """A key of ``raw`` that the flow neither reads (``reads``) nor accepts unread
    (``accepted``: the datasets' bookkeeping, the flow's ignored fields) is an error: a field
    the user believes is trained on (per-token weights, a mistyped ``loss_mask``) must not be
    dropped without a word.

    Raises:
        BatchError: One line naming the sample, the unread field(s), what the flow reads from a
            sample of this form and the two ways out.
    """
    known = set(reads) | set(accepted)
    unread = [key for key in raw if key not in known]
    if not unread:
        return
    names = ", ".join(map(repr, unread))
    what = (f"sample {index}, field {names}: flow {flow!r} does not read it" if len(unread) == 1
            else f"sample {index}, fields {names}: flow {flow!r} does not read them")
    raise BatchError(f"{what} (it reads {', '.join(reads)} from a sample of this form); declare "
                     f"a field in the flow's fields_and_seq_dims() to have it packed for the "
                     f"loss, list it in config key {ignored_key!r} if it is metadata not to "
                     f"train on, or drop it from the sample")
