"""The loop steps both entry points share: ``pretrain_gpt.py``'s loop (``training.train``) and
``MegatronWrap`` (``megatron.wrap.facade``) evaluate, log, save and tear down through these, so
the two cannot drift apart (e.g. one restoring train mode after an evaluation error and the
other not).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from megatron.varlen_training.config import CheckpointConfig
from megatron.varlen_training.log import print_rank_last
from megatron.varlen_training.iteration_metrics import format_validation_line


@contextlib.contextmanager
def eval_mode(model_chunks: Sequence) -> Iterator[None]:
    """Model chunks in eval mode for the block; train mode is restored even if it raises."""
    for chunk in model_chunks:
        chunk.eval()
    try:
        yield
    finally:
        for chunk in model_chunks:
            chunk.train()


def periodic_save_due(checkpoint: CheckpointConfig, iteration: int) -> bool:
    """--save with --save-interval: save after every ``save_interval``-th iteration."""
    return bool(checkpoint.save and checkpoint.save_interval
                and iteration % checkpoint.save_interval == 0)


def final_save_due(checkpoint: CheckpointConfig, iteration: int) -> bool:
    """At the end of ``pretrain_gpt.py``'s loop: save unless the periodic save just did."""
    return bool(checkpoint.save) and not periodic_save_due(checkpoint, iteration)


def log_validation_loss(iteration: int, loss: float | None, where: str = "",
                        name: str = "validation") -> None:
    """Megatron-LM's validation line between its two rules of dashes, on the last rank (it owns
    the loss; None: no line); ``where``, ``name``: :func:`format_validation_line`'s."""
    if loss is not None:
        line = format_validation_line(iteration, loss, where, name)
        rule = "-" * (len(line) + 1)  # Megatron-LM's length: one more than the line's
        print_rank_last(rule)
        print_rank_last(line)
        print_rank_last(rule)
