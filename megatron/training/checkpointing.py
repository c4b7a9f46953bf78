"""Save and resume with megatron-core dist_checkpointing (torch_dist format).

Layout (Megatron-LM's): ``<dir>/iter_0000003/`` holds one checkpoint and
``<dir>/latest_checkpointed_iteration.txt`` names the newest. The iteration in the directory
name is the number of iterations completed, i.e. the one the last log line printed.
Optimizer state uses the ``dp_reshardable`` distributed-optimizer format (DESIGN.md §3).
"""

from __future__ import annotations

import os

import torch

from megatron.core import dist_checkpointing
from megatron.training.model import unwrap

TRACKER_FILENAME = "latest_checkpointed_iteration.txt"
_OPTIMIZER_METADATA = {"distrib_optim_sharding_type": "dp_reshardable"}


def checkpoint_dir(root: str, iteration: int) -> str:
    return os.path.join(root, f"iter_{iteration:07d}")


def _model_keys(model) -> list[str]:
    return ["model"] if len(model) == 1 else [f"model{i}" for i in range(len(model))]


def _sharded_state_dict(model, optimizer, scheduler, iteration: int, is_loading: bool) -> dict:
    state = {key: unwrap(chunk).sharded_state_dict()
             for key, chunk in zip(_model_keys(model), model)}
    model_state = state["model"] if len(model) == 1 else {
        k: v for key in _model_keys(model) for k, v in state[key].items()}
    state["optimizer"] = optimizer.sharded_state_dict(
        model_state, is_loading=is_loading, metadata=_OPTIMIZER_METADATA)
    state["opt_param_scheduler"] = scheduler.state_dict()
    state["iteration"] = iteration
    return state


def _barrier() -> None:
    if torch.distributed.is_initialized():
        torch.distributed.barrier()


def save_checkpoint(root: str, iteration: int, model, optimizer, scheduler) -> str:
    """Writes iteration ``iteration`` under ``root`` and updates the tracker file."""
    path = checkpoint_dir(root, iteration)
    if torch.distributed.get_rank() == 0:
        os.makedirs(path, exist_ok=True)
    _barrier()
    state = _sharded_state_dict(model, optimizer, scheduler, iteration, is_loading=False)
    dist_checkpointing.save(state, path)
    _barrier()
    if torch.distributed.get_rank() == 0:
        with open(os.path.join(root, TRACKER_FILENAME), "w", encoding="utf-8") as tracker:
            tracker.write(str(iteration))
    _barrier()
    return path


def read_latest_iteration(root: str) -> int:
    """The iteration named by the tracker file; a clear error if there is no checkpoint."""
    tracker = os.path.join(root, TRACKER_FILENAME)
    if not os.path.isfile(tracker):
        raise ValueError(f"--load {root!r} holds no checkpoint ({TRACKER_FILENAME} is missing)")
    with open(tracker, encoding="utf-8") as handle:
        return int(handle.read().strip())


def _materialize_optimizer_state(optimizer) -> None:
    """Gives a fresh optimizer the state entries a checkpoint will fill.

    megatron-core's DistributedOptimizer builds its loading template from its current state,
    and without Apex/TE it expects torch Adam's ``step`` entry in it; a fresh optimizer has no
    state at all, and ``init_state_fn`` creates the moments but not ``step``. The values
    written here are placeholders: the load overwrites every one of them.
    """
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        if getattr(opt, "init_state_fn", None) is None or opt.optimizer is None:
            continue
        opt.init_state_fn(opt.optimizer, opt.config)
        for state in opt.optimizer.state.values():
            state.setdefault("step", torch.zeros((), dtype=torch.float32))


def _restore_adam_steps(optimizer) -> None:
    """Per-parameter Adam ``step`` from the restored param groups, one tensor per parameter.

    Without Apex/TE, megatron-core's DistributedOptimizer restores the iteration count into its
    param groups (``group["step"]``) but not into the per-parameter state torch Adam reads, and
    where it does set per-parameter steps it shares ONE tensor among them, which torch Adam
    increments in place once per parameter. Both skew bias correction after a resume.
    """
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(opt, "optimizer", None)
        for group in (inner.param_groups if inner is not None else ()):
            if "step" not in group:
                continue
            for param in group["params"]:
                inner.state[param]["step"] = torch.tensor(float(group["step"]))


def load_checkpoint(root: str, model, optimizer, scheduler) -> int:
    """Restores model, optimizer and LR scheduler; returns the iteration to continue from."""
    iteration = read_latest_iteration(root)
    _materialize_optimizer_state(optimizer)
    template = _sharded_state_dict(model, optimizer, scheduler, iteration, is_loading=True)
    state = dist_checkpointing.load(template, checkpoint_dir(root, iteration))
    for key, chunk in zip(_model_keys(model), model):
        unwrap(chunk).load_state_dict(state[key])
    with torch.no_grad():  # megatron-core copies into main-param views of leaves needing grad
        optimizer.load_state_dict(state["optimizer"])
    _restore_adam_steps(optimizer)
    scheduler.load_state_dict(state["opt_param_scheduler"])
    return int(state["iteration"])
