"""What a ``--load`` restores, and from where: Megatron-LM's fine-tuning flags as data.

``--finetune`` loads the model weights only and starts at iteration 0; ``--no-load-optim``
skips the optimizer state and the LR/WD schedule; ``--no-load-rng`` skips the random states;
``--pretrained-checkpoint`` is the fallback source, loaded as ``--finetune``, while ``--load``
holds no checkpoint (Megatron-LM's ``load_checkpoint``); ``--ckpt-step N`` loads iteration N
instead of the one the tracker file names (the tracker is then not needed). recipe_arguments.py
and checkpoint_arguments.py have the flags.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace

from megatron.varlen_training.config.checkpoint import CheckpointConfig

# The file whose presence makes a directory hold a checkpoint (the checkpoint package's tracker).
TRACKER_FILENAME = "latest_checkpointed_iteration.txt"
# The one --ckpt-format written and read, and Megatron-LM's others (core_v0.16.1's choices):
# checkpoint/format.py tells a folder in another one; here for the flag layer, which must not
# import torch.
SUPPORTED_FORMAT = "torch_dist"
ITERATION_FOLDER = re.compile(r"iter_(\d{7,})")  # iteration_folder's names
OTHER_FORMATS = ("torch", "zarr", "torch_dcp", "fsdp_dtensor")


@dataclass(frozen=True)
class LoadParts:
    """The parts of a checkpoint a load restores (model weights always)."""

    optimizer: bool = True
    """Optimizer state and the LR/WD schedule."""
    rng: bool = True
    """Every rank's random states."""
    iteration: bool = True
    """The iteration (and so the samples consumed); False: start at 0 (``--finetune``)."""
    step: int | None = None
    """``--ckpt-step``: the saved iteration to load; None: the tracker file's (the latest)."""

    @property
    def finetune(self) -> bool:
        """Weights only, a new run: the resume checks of data and schedule do not apply."""
        return not self.iteration


RESUME = LoadParts()
FINETUNE = LoadParts(optimizer=False, rng=False, iteration=False)


def load_parts(checkpoint: CheckpointConfig) -> LoadParts:
    """The parts ``--finetune``/``--no-load-optim``/``--no-load-rng`` leave to load."""
    if checkpoint.finetune:
        return replace(FINETUNE, step=checkpoint.ckpt_step)
    return LoadParts(optimizer=not checkpoint.no_load_optim, rng=not checkpoint.no_load_rng,
                     step=checkpoint.ckpt_step)


def iteration_folder(root: str, iteration: int) -> str:
    """Where iteration ``iteration`` is saved under ``root`` (Megatron-LM's ``iter_0000003``)."""
    return os.path.join(root, f"iter_{iteration:07d}")


def holds_checkpoint(root: str | None, step: int | None = None) -> bool:
    """Whether ``root`` holds a checkpoint, as Megatron-LM decides it: its tracker file, or
    with ``--ckpt-step`` (``step``) that iteration's folder."""
    if root is None:
        return False
    if step is not None:
        return os.path.isdir(iteration_folder(root, step))
    return os.path.isfile(os.path.join(root, TRACKER_FILENAME))


class TrackerError(ValueError):
    """The tracker file is missing or unusable; the message says what to pass instead. Callers
    turn it into their own one-line error (the flag layer here must not import torch)."""


def saved_iterations(root: str) -> list[int]:
    """The iterations with a folder under ``root`` (published ones: staging folders are hidden)."""
    names = os.listdir(root) if os.path.isdir(root) else []
    return sorted(int(match.group(1)) for name in names
                  if (match := re.fullmatch(ITERATION_FOLDER, name)))


def read_latest_iteration(root: str) -> int:
    """The iteration named by ``root``'s tracker file; a TrackerError if it is unusable."""
    tracker = os.path.join(root, TRACKER_FILENAME)
    if not os.path.isfile(tracker):
        saved = saved_iterations(root)
        named = (f"; it has iteration folders {', '.join(map(str, saved))}: pass --ckpt-step N "
                 f"to load one" if saved else "")
        own = re.fullmatch(ITERATION_FOLDER, os.path.basename(os.path.normpath(root)))
        if own:  # the iteration folder itself: --load names the folder above it
            named = (f"; it is iteration folder {int(own.group(1))}: pass --load "
                     f"{os.path.dirname(os.path.normpath(root))} --ckpt-step "
                     f"{int(own.group(1))}")
        raise TrackerError(f"--load {root!r} holds no checkpoint ({TRACKER_FILENAME} is "
                           f"missing{named})")
    with open(tracker, encoding="utf-8", errors="replace") as handle:
        text = handle.read().strip()
    if not text.isdigit():
        raise TrackerError(f"tracker file {tracker!r} is {'empty' if not text else 'garbled'} "
                           f"(got {text[:40]!r}); it should hold the latest iteration number")
    return int(text)


def _same_folder(first: str, second: str) -> bool:
    return os.path.realpath(first) == os.path.realpath(second)


def fresh_start_note(checkpoint: CheckpointConfig) -> str | None:
    """Megatron-LM's restartable job, ``--save`` and ``--load`` the same folder: while it holds
    no checkpoint yet (the job's first launch) the run starts from scratch, and this line says
    so; None otherwise. Not with ``--exit-on-missing-checkpoint`` or ``--ckpt-step`` (a load
    asked for explicitly), nor for a ``--load`` elsewhere: a source that holds nothing stops
    the run, so a mistyped one never trains from scratch."""
    load, save = checkpoint.load, checkpoint.save
    if load is None or save is None or not _same_folder(load, save) \
            or checkpoint.exit_on_missing_checkpoint or checkpoint.ckpt_step is not None \
            or checkpoint.pretrained_checkpoint is not None or holds_checkpoint(load):
        return None
    return (f"--load {load!r} holds no checkpoint yet ({TRACKER_FILENAME} is missing) and is "
            f"also --save: starting from scratch (a restartable job's first launch; "
            f"--exit-on-missing-checkpoint stops instead)")


def checkpoint_source(checkpoint: CheckpointConfig) -> tuple[str, LoadParts] | None:
    """Where the run starts from and what it loads there; None: from scratch.

    ``--load`` when it holds a checkpoint (or no ``--pretrained-checkpoint`` is given: a
    missing checkpoint is then an error at load, except for a restartable job's first launch:
    :func:`fresh_start_note`), else ``--pretrained-checkpoint`` as ``--finetune``.
    """
    pretrained = checkpoint.pretrained_checkpoint
    if pretrained is not None and not holds_checkpoint(checkpoint.load, checkpoint.ckpt_step):
        return pretrained, replace(FINETUNE, step=checkpoint.ckpt_step)
    if checkpoint.load is not None and fresh_start_note(checkpoint) is None:
        return checkpoint.load, load_parts(checkpoint)
    return None
