"""Where a resumed run's global batches begin: at the samples its checkpoint consumed.

Megatron-LM's sampler continues at the checkpoint's consumed samples whatever the batch size,
so a resume may change ``--global-batch-size`` (a larger batch later in training, another
cluster): the resumed run's first batch starts where the checkpoint's run stopped reading, and
every batch after it is of this run's size. pretrain_gpt.py's loop reads global batch i at
iteration i, so that point is an anchor, (iteration, first sample): batch_rampup.py's
:class:`~megatron.varlen_training.batch_rampup.BatchAnchor`. The flag layer finds it here,
before anything is sized from it (a ``--train-samples`` run's iterations, the datasets' sample
counts). For a resume with the same batch size it is the same stream as counting from sample
0; a checkpoint whose run trained batches of other sizes (megatron.wrap's runtime batches, an
earlier change) continues the same way.

None, counted from sample 0, with ``--rampup-batch-size`` on either side (a ramp's sizes
depend on ``--global-batch-size``: the load refuses a change, naming both values, and checks
the position against the ramp), for ``--finetune`` or ``--pretrained-checkpoint`` (a new run)
and for a checkpoint this cannot read (the load's checks say what is wrong in one line).
What else follows a changed batch size is Megatron-LM's: an iteration-based LR schedule counts
its lengths in batches of the new size (the load refuses the difference unless
``--override-opt_param-scheduler`` or ``--use-checkpoint-opt_param-scheduler``), and indexed
data built for ``--train-iters`` x the new size is another sample order (refused unless
``--override-data-fingerprint``; ``--train-samples`` and whole documents keep the order).

Flag layer: reads ``run_args.json`` as JSON (no torch, no run configs).
"""

from __future__ import annotations

import json
import os

from megatron.varlen_training.load_options import (
    TrackerError, holds_checkpoint, iteration_folder, read_latest_iteration,
)
from megatron.varlen_training.resume.run_args_keys import (
    DATA_POSITION_KEY, GLOBAL_BATCH_KEY, RAMPUP_KEY, RUN_ARGS_FILENAME,
)


def resumed_batch_anchor(args) -> tuple[int, int] | None:
    """(iteration, first sample) where this run's ``--global-batch-size`` batches begin: the
    resumed checkpoint's iteration and consumed samples; None: from iteration 0 at sample 0
    (module docstring). ``args``: the namespace being validated (load and batch flags)."""
    if args.finetune or args.rampup_batch_size is not None \
            or not holds_checkpoint(args.load, args.ckpt_step):
        return None
    try:
        iteration = args.ckpt_step if args.ckpt_step is not None \
            else read_latest_iteration(args.load)
    except TrackerError:
        return None
    saved = _read_record(iteration_folder(args.load, iteration))
    if saved is None or saved.get(RAMPUP_KEY) is not None:
        return None
    consumed = saved.get(DATA_POSITION_KEY)
    if _is_count(consumed):
        return iteration, consumed
    gbs = saved.get(GLOBAL_BATCH_KEY)  # saved before the position was recorded: its batches
    return (iteration, iteration * gbs) if _is_count(gbs) else None


def _read_record(folder: str) -> dict | None:
    try:
        with open(os.path.join(folder, RUN_ARGS_FILENAME), encoding="utf-8") as handle:
            saved = json.load(handle)
    except (OSError, ValueError):
        return None
    return saved if isinstance(saved, dict) else None


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
