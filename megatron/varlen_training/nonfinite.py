"""``--check-for-nan-in-loss-and-grad``: stop at the first NaN/Inf loss or gradient norm.

The check runs inside the training step, after the grad norm is known and BEFORE the optimizer
applies the update (``training.optimizer_step``): a non-finite step changes no weight, no
optimizer state, no LR schedule and no iteration counter. So the state in memory is still the
last good one (``MegatronWrap.save()`` after the error writes it, not NaN weights), and the
newest checkpoint on disk is one taken before the loss went non-finite. Only the last pipeline
stage knows the loss, and a NaN may show up on one rank only: one all-reduce (MAX over the
world, two integers) makes every rank take the same decision, so all of them raise
:class:`NonFiniteLossError` together and none waits in a later collective. A run of one process
has nothing to agree on: it decides on the host values it already has, without a device round
trip (on a GPU that round trip is two host waits per step: results/gpu/REPORT.md).
"""

from __future__ import annotations

import math

import torch

from megatron.varlen_training.errors import NonFiniteLossError
from megatron.varlen_training.log import is_multi_rank
from megatron.varlen.packing import host_to_device
from megatron.varlen.platform import get_device

_LOSS, _GRAD = 0, 1


def _is_bad(value) -> bool:
    return value is not None and not math.isfinite(float(value))


def _agreed(flags: list[int]) -> list[int]:
    """``flags`` MAX-reduced over the world: the same list on every rank. One read back of the
    reduced flags (the decision must be the same everywhere); none with a single process."""
    if not is_multi_rank():
        return flags
    reduced = host_to_device(torch.tensor(flags, dtype=torch.int32), get_device())
    torch.distributed.all_reduce(reduced, op=torch.distributed.ReduceOp.MAX)
    return reduced.tolist()


def check_finite(iteration: int, loss: float | None, grad_norm: float | None) -> None:
    """Raises NonFiniteLossError on every rank if any rank saw a non-finite value.

    Args:
        iteration: The iteration being checked (the number its log line would print).
        loss: This rank's reported loss (None off the last pipeline stage).
        grad_norm: This rank's gradient norm (None when the optimizer computed none).
    """
    flags = _agreed([int(_is_bad(loss)), int(_is_bad(grad_norm))])
    if not any(flags):
        return
    names = [name for name, bad in zip(("lm loss", "grad norm"), flags) if bad]
    what = " and ".join(names) + (" are" if len(names) > 1 else " is")
    raise NonFiniteLossError(
        f"iteration {iteration}: {what} NaN/Inf; the step was not applied (weights, optimizer "
        f"and LR schedule are those of iteration {iteration - 1}; the latest checkpoint, if "
        f"any, is the last good one). Lower --lr or set --clip-grad; "
        f"--no-check-for-nan-in-loss-and-grad trains on regardless")
