"""What a checkpoint holds besides the model weights: Megatron-LM's ``--no-save-optim`` /
``--no-save-rng`` (checkpoint_save_arguments.py). No megatron-core here: resume/consistency.py
records the parts, and the flag layer reads that module.

A checkpoint records in ``run_args.json`` which parts it holds (:data:`SAVED_PARTS_KEY`;
checkpoints written before the record hold both). Loading one follows Megatron-LM's
``load_checkpoint``: without optimizer state, a resume that would load it stops in one line
naming ``--no-load-optim`` / ``--finetune``; without random states, the load skips them.
"""

from __future__ import annotations

from dataclasses import replace

from megatron.varlen_training.config.checkpoint import CheckpointConfig
from megatron.varlen_training.errors import CheckpointError
from megatron.varlen_training.load_options import LoadParts

SAVED_PARTS_KEY = "saved_parts"  # run_args.json: {"optimizer": bool, "rng": bool}
OPTIMIZER_KEY = "optimizer"  # run_args.json: --optimizer of the run that saved
DEFAULT_OPTIMIZER = "adam"  # what checkpoints without the record were trained with
_ALL_PARTS = {"optimizer": True, "rng": True}  # what checkpoints without the record hold


def saved_parts(checkpoint: CheckpointConfig) -> dict[str, bool]:
    """The parts a save of this run writes besides the weights (and the iteration)."""
    return {"optimizer": not checkpoint.no_save_optim, "rng": not checkpoint.no_save_rng}


def recorded_parts(run_args: dict) -> dict[str, bool]:
    """The parts a checkpoint's ``run_args.json`` says it holds."""
    recorded = run_args.get(SAVED_PARTS_KEY)
    if not isinstance(recorded, dict):
        return dict(_ALL_PARTS)
    return {part: recorded.get(part, True) is not False for part in _ALL_PARTS}


def recorded_optimizer(run_args: dict) -> str:
    """The --optimizer whose state a checkpoint's ``run_args.json`` says it holds."""
    return str(run_args.get(OPTIMIZER_KEY, DEFAULT_OPTIMIZER))


def parts_to_load(folder: str, held: dict[str, bool], parts: LoadParts,
                  saved_optimizer: str = DEFAULT_OPTIMIZER,
                  optimizer: str | None = None) -> LoadParts:
    """``parts`` narrowed to what the checkpoint in ``folder`` holds (``held``), as
    Megatron-LM's load does: missing optimizer state that the load would restore is a one-line
    CheckpointError; missing random states are skipped. With ``optimizer`` (this run's
    --optimizer), state of another optimizer (``saved_optimizer``) is one line too."""
    if parts.optimizer and optimizer is not None and held["optimizer"] \
            and saved_optimizer != optimizer:
        raise CheckpointError(
            f"checkpoint {folder!r} holds --optimizer {saved_optimizer} state, this run is "
            f"--optimizer {optimizer}: add --no-load-optim to start {optimizer} from its "
            f"weights, or resume with --optimizer {saved_optimizer}")
    if parts.optimizer and not held["optimizer"]:
        raise CheckpointError(
            f"checkpoint {folder!r} holds no optimizer state (saved with --no-save-optim): add "
            f"--no-load-optim (or --finetune) to load its weights and start the optimizer "
            f"afresh, as Megatron-LM requires")
    if parts.rng and not held["rng"]:
        return replace(parts, rng=False)
    return parts

