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


def load_checkpoint(root: str, model, optimizer, scheduler) -> int:
    """Restores model, optimizer and LR scheduler; returns the iteration to continue from."""
    iteration = read_latest_iteration(root)
    template = _sharded_state_dict(model, optimizer, scheduler, iteration, is_loading=True)
    state = dist_checkpointing.load(template, checkpoint_dir(root, iteration))
    for key, chunk in zip(_model_keys(model), model):
        unwrap(chunk).load_state_dict(state[key])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["opt_param_scheduler"])
    return int(state["iteration"])
