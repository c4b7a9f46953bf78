"""MTP's one-token roll within each packed sequence, in a fixed number of operations.

megatron-core 0.16.1's ``roll_tensor`` with ``packed_seq_params`` (``_roll_tensor_packed_seq``)
loops over the sequences of the pack: per sequence two boundary reads, a slice, a ``roll``, a
fill and a copy -- for input ids, position ids, labels and the loss mask, at every MTP depth:
host work that grows with the number of sequences in a micro-batch. Under CP it adds up to four
point-to-point calls per sequence (each chunk's first token to the neighbouring CP rank).

:func:`packed_roll` gives the same values in a number of operations that does not depend on
the number of sequences, with the positions built once per micro-batch from the host boundaries:

* without CP: one ``roll`` of the whole stream and one ``index_fill`` of every sequence's last
  position (whose rolled-in value would come from the next sequence);
* under CP (every sequence split in 2 x CP chunks, this rank holding chunk r and chunk
  2 CP - 1 - r of each): one ``roll``, the first token of each of this rank's chunks gathered
  from every rank of the CP group by ONE all-gather, and each chunk's last position filled
  with the first token of the chunk that follows it (:func:`_roll_cp`).

It falls back to megatron-core's loop where it does not apply: a roll other than MTP's, a
stream that the boundaries do not cover from 0 to its end, or (under CP) boundaries that do not
split into equal chunks.

:func:`rolling_within_sequences` puts it in place of megatron-core's ``roll_tensor`` for the
duration of one MTP post-processing (:class:`~megatron.varlen.model.mtp.VarlenGPTModel`).

Why a swap of a module global: megatron-core 0.16.1 offers no seam for the roll. It calls
``roll_tensor`` by its module-global name in two places: ``GPTModel._postprocess``, inline in
its MTP loss loop (labels and loss mask; no method, argument or submodule to hand a roll to:
avoiding it means rewriting that loop with its loss logging and scaling), and
``MultiTokenPredictionLayer._get_embeddings`` (input and position ids; a private method, which
our MTP spec could override, but the first caller would still need the swap). One swap, then,
scoped to one call, with its failure modes made harmless:

* restored in a ``finally`` (``swap_attributes``), also when the forward raises;
* a block inside a block changes nothing (the outer one restores);
* each caller's stand-in falls back to that caller's own ``roll_tensor`` and gives its values
  for every call (tested against it), so a roll in the block that is not MTP's (another
  model, another thread) gets the right values, only not the fixed operation count;
* a megatron-core whose callers no longer name ``roll_tensor`` fails loudly here (a missing
  global) or in tests/unit_tests/varlen/model/test_mtp_roll.py (a caller that stopped using it).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from megatron.varlen.attention.collectives import all_gather_dim0
from megatron.varlen.attention.cp_group import swap_attributes
from megatron.varlen.packing.packed_seq import has_host_boundaries, host_to_device

_ROLL_SHIFT = -1  # MTP's roll: one token to the left
_LAST_POSITIONS = "mtp-roll-last-positions"  # kinds of the micro-batch cache's entries
_CP_CHUNKS = "mtp-roll-cp-chunks"
_CHUNKS_PER_RANK = 2  # the zigzag CP layout: a front and a mirrored back chunk per sequence
_OURS = "_varlen_packed_roll"  # marks the stand-in, so that nested blocks do not wrap it again
_ROLL_GLOBAL = "roll_tensor"  # the global the swap replaces in each caller's module
# The modules whose functions call roll_tensor by their own global name (gpt_model imports it
# from multi_token_prediction).
_ROLL_CALLERS = ("megatron.core.transformer.multi_token_prediction",
                 "megatron.core.models.gpt.gpt_model")


def _host_bounds(params) -> list[int]:
    return [int(b) for b in params.host_cu_seqlens.tolist()]


def _last_positions(params, device) -> tuple[torch.Tensor | None, int]:
    """([m] stream position of the last token of every non-empty sequence, on ``device``, or
    None when the boundaries do not start at 0; the stream length they cover)."""
    bounds = _host_bounds(params)
    if not bounds or bounds[0] != 0:
        return None, -1
    ends = [end - 1 for start, end in zip(bounds, bounds[1:]) if end > start]
    return host_to_device(torch.tensor(ends, dtype=torch.int64), device), bounds[-1]


@dataclass(frozen=True)
class _CpChunks:
    """Where this rank's chunks of a micro-batch's m non-empty sequences sit in its stream."""

    firsts: torch.Tensor       # [2m] first position of every chunk: the m fronts, then the m backs
    front_lasts: torch.Tensor  # [m] last position of every front chunk
    back_lasts: torch.Tensor   # [m] last position of every back chunk
    stream: int                # this rank's stream length the chunks cover


def _cp_chunks(params, cp_size: int, device) -> _CpChunks | None:
    """This rank's chunk positions (the same on every rank of the group: each holds 1 / cp of
    every sequence), or None where megatron-core's halves would not be equal chunks of the
    zigzag layout (a boundary not divisible by 2 x cp, or not starting at 0)."""
    bounds = _host_bounds(params)
    if not bounds or bounds[0] != 0 or any(b % (_CHUNKS_PER_RANK * cp_size) for b in bounds):
        return None
    local = [b // cp_size for b in bounds]
    # Empty sequences have no chunk (megatron-core's loop cannot roll them under CP).
    halves = [(start, (end - start) // 2) for start, end in zip(local, local[1:]) if end > start]
    fronts = [start for start, _ in halves]
    backs = [start + half for start, half in halves]

    def positions(values: list[int]) -> torch.Tensor:
        return host_to_device(torch.tensor(values, dtype=torch.int64), device)

    return _CpChunks(firsts=positions(fronts + backs),
                     front_lasts=positions([back - 1 for back in backs]),
                     back_lasts=positions([back + half - 1
                                           for back, (_, half) in zip(backs, halves)]),
                     stream=local[-1])


def _all_gather(tensor: torch.Tensor, group) -> torch.Tensor:
    """[group size, *tensor.shape]: every rank's ``tensor``, in group rank order."""
    # bool is sent as its bytes (not every backend gathers bool).
    send = tensor.view(torch.uint8) if tensor.dtype == torch.bool else tensor
    out = all_gather_dim0(send.unsqueeze(0), group)
    return out.view(torch.bool) if tensor.dtype == torch.bool else out


def _roll_cp(tensor: torch.Tensor, chunks: _CpChunks, cp_group) -> torch.Tensor:
    """Rolled ``tensor`` ([..., T_r], this rank's zigzag share) within each chunk, each chunk's
    last position holding the first token of the next chunk of its sequence (0 after the
    sequence's last chunk): megatron-core's values, one all-gather for all sequences.

    Rank r holds chunk r (front) and 2 cp - 1 - r (back) of every sequence. Front chunk r is
    followed by chunk r + 1: rank r + 1's front, or on the last rank its own back. Back chunk
    2 cp - 1 - r is followed by chunk 2 cp - r: rank r - 1's back, or on rank 0 nothing.
    """
    rank, size = cp_group.rank(), cp_group.size()
    num = chunks.front_lasts.numel()
    rolled = torch.roll(tensor, shifts=_ROLL_SHIFT, dims=-1)
    firsts = _all_gather(tensor.index_select(-1, chunks.firsts), cp_group)  # [cp, ..., 2m]
    next_front = firsts[rank + 1, ..., :num] if rank + 1 < size else firsts[rank, ..., num:]
    rolled.index_copy_(-1, chunks.front_lasts, next_front)
    if rank > 0:
        rolled.index_copy_(-1, chunks.back_lasts, firsts[rank - 1, ..., num:])
    else:
        rolled.index_fill_(-1, chunks.back_lasts, 0)
    return rolled


def _roll_without_cp(tensor: torch.Tensor, params) -> torch.Tensor | None:
    last, stream = params.derived.get((_LAST_POSITIONS, str(tensor.device)),
                                      lambda: _last_positions(params, tensor.device))
    if last is None or stream != tensor.size(-1):
        return None
    return torch.roll(tensor, shifts=_ROLL_SHIFT, dims=-1).index_fill_(-1, last, 0)


def _roll_with_cp(tensor: torch.Tensor, params, cp_group) -> torch.Tensor | None:
    chunks = params.derived.get((_CP_CHUNKS, cp_group.size(), str(tensor.device)),
                                lambda: _cp_chunks(params, cp_group.size(), tensor.device))
    if chunks is None or chunks.stream != tensor.size(-1):
        return None
    return _roll_cp(tensor, chunks, cp_group)


def packed_roll(original: Callable, tensor: torch.Tensor, shifts=_ROLL_SHIFT, dims=-1,
                cp_group=None, packed_seq_params=None):
    """megatron-core's ``roll_tensor(tensor, shifts, dims, cp_group, packed_seq_params)``:
    (rolled, rolled.sum()), the same values; ``original`` where this does not apply."""
    rolled = None
    last_dim = dims in (-1, tensor.dim() - 1)
    if (packed_seq_params is not None and shifts == _ROLL_SHIFT and last_dim
            and has_host_boundaries(packed_seq_params)):
        if cp_group is None or cp_group.size() == 1:
            rolled = _roll_without_cp(tensor, packed_seq_params)
        else:
            rolled = _roll_with_cp(tensor, packed_seq_params, cp_group)
    if rolled is None:
        return original(tensor, shifts=shifts, dims=dims, cp_group=cp_group,
                        packed_seq_params=packed_seq_params)
    return rolled, rolled.sum()


def _roll_callers() -> list:
    """megatron-core's modules whose functions call ``roll_tensor`` by its global name."""
    import importlib

    modules = [importlib.import_module(name) for name in _ROLL_CALLERS]
    missing = [module.__name__ for module in modules if not hasattr(module, _ROLL_GLOBAL)]
    if missing:
        raise RuntimeError(f"{', '.join(missing)} has no {_ROLL_GLOBAL}: this megatron-core is "
                           "not the 0.16.1 that MTP's packed roll was written for "
                           "(megatron/varlen/model/mtp_roll.py)")
    return modules


def _stand_in(original: Callable) -> Callable:
    """``original`` (a caller's own ``roll_tensor``) routed through :func:`packed_roll`."""

    def roll_tensor(*args, **kwargs):
        return packed_roll(original, *args, **kwargs)

    setattr(roll_tensor, _OURS, True)
    return roll_tensor


@contextlib.contextmanager
def rolling_within_sequences() -> Iterator[None]:
    """megatron-core's MTP rolls go through :func:`packed_roll` inside the block, restored on
    leaving it however it is left; an inner block changes nothing (module docstring)."""
    modules = _roll_callers()
    originals = [getattr(module, _ROLL_GLOBAL) for module in modules]
    if any(getattr(roll, _OURS, False) for roll in originals):
        yield  # an outer block holds the swap and restores it
        return
    with swap_attributes([(module, _ROLL_GLOBAL, _stand_in(original))
                          for module, original in zip(modules, originals)]):
        yield
