"""MTP's one-token roll within each packed sequence, in a fixed number of operations.

megatron-core 0.16.1's ``roll_tensor`` with ``packed_seq_params`` (``_roll_tensor_packed_seq``)
loops over the sequences of the pack: per sequence two boundary reads, a slice, a ``roll``, a
fill and a copy -- for input ids, position ids, labels and the loss mask, at every MTP depth:
host work that grows with the number of sequences in a micro-batch. Without CP the same result
is one ``roll`` of the whole stream and one ``index_fill`` of every sequence's last position
(whose rolled-in value would come from the next sequence), with the positions built once per
micro-batch from the host boundaries. :func:`packed_roll` is that; it falls back to
megatron-core's loop where it does not apply (CP > 1: the roll exchanges chunk boundaries
between ranks; a stream that the boundaries do not cover from 0 to its end).

:func:`rolling_within_sequences` puts it in place of megatron-core's ``roll_tensor`` for the
duration of one MTP post-processing (:class:`~megatron.varlen.model.mtp.VarlenGPTModel`).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch

from megatron.varlen.packing.packed_seq import has_host_boundaries, host_to_device

_ROLL_SHIFT = -1  # MTP's roll: one token to the left
_LAST_POSITIONS = "mtp-roll-last-positions"  # kind of the micro-batch cache's entry
# The modules that call roll_tensor by their own global name (gpt_model imports it).
_OURS = "_varlen_packed_roll"  # marks the stand-in, so that nested blocks do not wrap it again
_ROLL_CALLERS = ("megatron.core.transformer.multi_token_prediction",
                 "megatron.core.models.gpt.gpt_model")


def _last_positions(params, device) -> tuple[torch.Tensor | None, int]:
    """([m] stream position of the last token of every non-empty sequence, on ``device``, or
    None when the boundaries do not start at 0; the stream length they cover)."""
    bounds = [int(b) for b in params.host_cu_seqlens.tolist()]
    if not bounds or bounds[0] != 0:
        return None, -1
    ends = [end - 1 for start, end in zip(bounds, bounds[1:]) if end > start]
    return host_to_device(torch.tensor(ends, dtype=torch.int64), device), bounds[-1]


def packed_roll(original: Callable, tensor: torch.Tensor, shifts=_ROLL_SHIFT, dims=-1,
                cp_group=None, packed_seq_params=None):
    """megatron-core's ``roll_tensor(tensor, shifts, dims, cp_group, packed_seq_params)``:
    (rolled, rolled.sum()), the same values; ``original`` where this does not apply."""
    last_dim = dims in (-1, tensor.dim() - 1)
    cp_size = cp_group.size() if cp_group is not None else 1
    if (packed_seq_params is None or cp_size != 1 or shifts != _ROLL_SHIFT or not last_dim
            or not has_host_boundaries(packed_seq_params)):
        return original(tensor, shifts=shifts, dims=dims, cp_group=cp_group,
                        packed_seq_params=packed_seq_params)
    last, stream = packed_seq_params.derived.get(
        (_LAST_POSITIONS, str(tensor.device)),
        lambda: _last_positions(packed_seq_params, tensor.device))
    if last is None or stream != tensor.size(-1):
        return original(tensor, shifts=shifts, dims=dims, cp_group=cp_group,
                        packed_seq_params=packed_seq_params)
    rolled = torch.roll(tensor, shifts=shifts, dims=-1).index_fill_(-1, last, 0)
    return rolled, rolled.sum()


@contextlib.contextmanager
def rolling_within_sequences() -> Iterator[None]:
    """megatron-core's MTP rolls go through :func:`packed_roll` inside the block (re-entrant:
    an inner block changes nothing)."""
    import importlib

    modules = [importlib.import_module(name) for name in _ROLL_CALLERS]
    originals = [module.roll_tensor for module in modules]
    if any(getattr(roll, _OURS, False) for roll in originals):
        yield
        return
    mcore_roll = originals[0]

    def roll_tensor(*args, **kwargs):
        return packed_roll(mcore_roll, *args, **kwargs)

    setattr(roll_tensor, _OURS, True)
    for module in modules:
        module.roll_tensor = roll_tensor
    try:
        yield
    finally:
        for module, original in zip(modules, originals):
            module.roll_tensor = original
