"""The multi-token-prediction losses an iteration reports (Megatron-LM's ``mtp_1 loss``, ...),
token-weighted over the global batch so that packing and CP layout cannot change them.

megatron-core 0.16.1 computes each MTP depth's loss inside ``GPTModel._postprocess`` and hands
``MTPLossLoggingHelper.save_loss_to_tracker`` only the micro-batch's mean (its masked loss sum
over its count of loss tokens); Megatron-LM then averages those means over micro-batches and
data-parallel ranks, a number that moves with how tokens are grouped into micro-batches. Here
:func:`recording_mtp_losses` keeps, for the duration of one ``_postprocess``, each depth's SUM
and COUNT: the count is the sum of the rolled loss mask, which megatron-core's loop takes from
the roll just before it saves the loss (``loss_mask, num_tokens = roll_tensor(loss_mask, ...)``),
so the stand-in roll remembers the last count it returned. At the end of a step one SUM
all-reduce over the data-parallel x context-parallel group gives each depth's loss per real
MTP token of the global batch: Megatron-LM's value whenever every micro-batch holds as many loss
tokens (unpacked equal-length samples). megatron-core's own tracker still receives its values.
The count megatron-core divides by is at least 1 (:class:`_LastCountRoll`): a micro-batch
without MTP loss tokens adds no MTP loss instead of a NaN.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from megatron.core.models.gpt import gpt_model
from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper
from megatron.varlen.attention.cp_group import swap_attributes

_ROLL_GLOBAL = "roll_tensor"  # the name gpt_model's MTP loss loop calls its roll by
_SAVE = "save_loss_to_tracker"  # megatron-core's MTP loss logging hook (a staticmethod)
_SUMS: dict[int, torch.Tensor] = {}  # depth index (0-based) -> [loss sum, loss tokens]


def record(depth_index: int, loss_sum: torch.Tensor, count: torch.Tensor) -> None:
    """Adds one micro-batch's masked loss sum and loss-token count at ``depth_index``."""
    pair = torch.stack([loss_sum.detach().double().reshape(()),
                        count.detach().double().reshape(())])
    previous = _SUMS.get(depth_index)
    _SUMS[depth_index] = pair if previous is None else previous + pair


def clear() -> None:
    _SUMS.clear()


def reduce_and_clear(num_depths: int, device, group=None) -> list[float | None]:
    """Each depth's loss per loss token over ``group`` (every rank of it calls this: one
    all-reduce; None: no reduction); None for a depth without loss tokens."""
    table = torch.zeros(num_depths, 2, dtype=torch.float64, device=device)
    for depth_index, pair in _SUMS.items():
        table[depth_index] += pair.to(table)
    clear()
    if group is not None:
        torch.distributed.all_reduce(table, group=group)
    return [float(loss_sum / count) if count > 0 else None for loss_sum, count in table.tolist()]


class _LastCountRoll:
    """Calls ``roll`` and keeps the count (the rolled tensor's sum) it returned last.

    megatron-core divides by the count it gets (the MTP loss without
    ``--calculate-per-token-loss``, and its logged mean), so it gets at least 1: a micro-batch
    without MTP loss tokens (unpacked one-token samples) then adds its masked loss sum, 0,
    instead of 0 / 0 = NaN, which stopped the run at the grad norm. Any other count goes
    through unchanged; the kept count stays the true one (the report counts 0 tokens)."""

    def __init__(self, roll):
        self.roll = roll
        self.count = None

    def __call__(self, *args, **kwargs):
        rolled, count = self.roll(*args, **kwargs)
        self.count = count
        return rolled, count.clamp(min=1)  # on the device: no host read


@contextlib.contextmanager
def recording_mtp_losses() -> Iterator[None]:
    """For one ``GPTModel._postprocess``: each MTP depth's loss sum and loss-token count go to
    :func:`record` beside megatron-core's own tracker (module docstring). Both swaps are undone
    in a ``finally``; the roll wraps whichever roll is in place (ours under packing)."""
    roll = _LastCountRoll(getattr(gpt_model, _ROLL_GLOBAL))
    original_save = MTPLossLoggingHelper.save_loss_to_tracker

    def save_loss_to_tracker(loss, layer_number, num_layers, *args, **kwargs):
        if layer_number is not None and roll.count is not None:
            count = roll.count
            # loss = sum / count; a micro-batch without MTP tokens adds 0 / 0: count it as 0.
            loss_sum = torch.where(count > 0, loss.detach() * count, torch.zeros_like(loss))
            record(layer_number, loss_sum, count)
        return original_save(loss, layer_number, num_layers, *args, **kwargs)

    # The class attribute as stored (a staticmethod), so restoring it restores exactly that.
    stored_save = MTPLossLoggingHelper.__dict__[_SAVE]
    with swap_attributes([(gpt_model, _ROLL_GLOBAL, roll)]):
        setattr(MTPLossLoggingHelper, _SAVE, staticmethod(save_loss_to_tracker))
        try:
            yield
        finally:
            setattr(MTPLossLoggingHelper, _SAVE, stored_save)
