"""Restoring the optimizer state a checkpoint holds into megatron-core's optimizers, with the
corrections torch's Adam needs where Apex and Transformer Engine are absent (CPU).

megatron-core 0.16.1's DistributedOptimizer is written for Apex/TE's fused Adam, which keeps
the iteration count in its param groups. torch Adam keeps a per-parameter ``step`` tensor
instead, which the loading code does not expect everywhere:

- the loading template is built from the optimizer's current state, which a fresh optimizer
  does not have (:func:`materialize`);
- the ``fully_reshardable`` format (``--dist-ckpt-optim-fully-reshardable``) saves no ``step``
  per parameter, and its load copies every per-parameter state entry from the checkpoint, so
  it raised ``KeyError: 'step'`` on every rank: the steps are set aside while the parameter
  state is copied (:func:`load`);
- restored steps are shared or missing per parameter (:func:`_restore_adam_steps`).
"""

from __future__ import annotations

import torch

from megatron.varlen_training.checkpoint.sharding import FULLY_RESHARDABLE
from megatron.varlen_training.optimizer_kernels import chained_optimizers

# megatron-core's keys in a distributed optimizer's state dict (DistributedOptimizer.
# sharded_state_dict): the per-parameter state and the format it was saved in.
_PARAM_STATE_KEY = "param_state"
_SHARDING_TYPE_KEY = "param_state_sharding_type"
_STEP = "step"  # torch Adam's per-parameter iteration count


def materialize(optimizer) -> None:
    """Gives a fresh optimizer the state entries a checkpoint will fill.

    megatron-core's DistributedOptimizer builds its loading template from its current state,
    and without Apex/TE it expects torch Adam's ``step`` entry in it; a fresh optimizer has no
    state at all, and ``init_state_fn`` creates the moments but not ``step``. The values
    written here are placeholders: the load overwrites every one of them.
    """
    for opt in chained_optimizers(optimizer):
        if getattr(opt, "init_state_fn", None) is None or opt.optimizer is None:
            continue
        opt.init_state_fn(opt.optimizer, opt.config)
        for state in opt.optimizer.state.values():
            state.setdefault(_STEP, torch.zeros((), dtype=torch.float32))


def _per_optimizer_states(optimizer, state: dict) -> list[tuple[object, dict]]:
    """(optimizer, its state dict) for each optimizer of a chain, as megatron-core's
    ChainedOptimizer pairs them: one optimizer reads the whole dict, several read one entry
    each, in index order."""
    optimizers = chained_optimizers(optimizer)
    if len(optimizers) == 1:
        return [(optimizers[0], state)]
    if set(state) != set(range(len(optimizers))):
        # Another nesting (EP 1 <-> > 1): optimizer_nesting converted it before the load where
        # it can, so megatron-core's load_state_dict raises on what is left.
        return []
    return [(opt, state[index]) for index, opt in enumerate(optimizers)]


def _set_aside_fully_reshardable(pairs) -> list[tuple[object, object]]:
    """Takes the ``fully_reshardable`` parameter states out of their state dicts (their load
    is done by :func:`_load_parameter_states`); the other formats stay for megatron-core."""
    taken = []
    for opt, opt_state in pairs:
        if isinstance(opt_state, dict) \
                and opt_state.get(_SHARDING_TYPE_KEY) == FULLY_RESHARDABLE \
                and _PARAM_STATE_KEY in opt_state:
            taken.append((opt, opt_state.pop(_PARAM_STATE_KEY)))
    return taken


def _load_parameter_states(taken) -> None:
    """megatron-core's fully_reshardable parameter load, with torch Adam's ``step`` entries
    (which that format does not hold) out of the way; :func:`_restore_adam_steps` puts them
    back from the param groups."""
    for opt, param_state in taken:
        for state in opt.optimizer.state.values():
            state.pop(_STEP, None)
        opt.load_parameter_state_from_fully_reshardable(param_state)


def _restore_adam_steps(optimizer) -> None:
    """Per-parameter Adam ``step`` from the restored param groups, one tensor per parameter.

    Without Apex/TE, megatron-core's DistributedOptimizer restores the iteration count into its
    param groups (``group["step"]``) but not into the per-parameter state torch Adam reads, and
    where it does set per-parameter steps it shares ONE tensor among them, which torch Adam
    increments in place once per parameter. Both skew bias correction after a resume.
    """
    for opt in chained_optimizers(optimizer):
        inner = getattr(opt, "optimizer", None)
        for group in (inner.param_groups if inner is not None else ()):
            if _STEP not in group:
                continue
            for param in group["params"]:
                inner.state[param][_STEP] = torch.tensor(float(group[_STEP]))


def load(optimizer, state: dict) -> None:
    """Restores ``state`` (the checkpoint's ``optimizer`` entry) into ``optimizer``."""
    taken = _set_aside_fully_reshardable(_per_optimizer_states(optimizer, state))
    with torch.no_grad():  # megatron-core copies into main-param views of leaves needing grad
        optimizer.load_state_dict(state)
        _load_parameter_states(taken)
    _restore_adam_steps(optimizer)
