"""The optimizer's common checkpoint state converted between expert parallelism 1 and > 1.

megatron-core 0.16.1's ``get_megatron_optimizer`` builds ONE optimizer at EP 1 and, at EP > 1,
chains the dense optimizer and an expert one: the expert parameters (``allreduce`` False, set
only with EP > 1) form param groups of their own, marked ``is_expert_parallel``. A chain's
checkpoint nests each optimizer's common state (param groups, Adam's common step, the format, a
grad scaler) under its index (``{0: {...}, 1: {...}}``), a single optimizer's is flat, and
``ChainedOptimizer.load_state_dict`` reads only the nesting of this run ("Expected 2 entries in
state dict, but got 4." / ``KeyError: 'optimizer'``). The per-parameter tensors need nothing:
where the save set ``chained_optim_avoid_prefix`` (every save since the metadata is stored,
:mod:`.sharding`) and the format is per parameter (the plain optimizer, or the distributed
optimizer's ``fully_reshardable``) they are keyed by parameter at every EP size.

So a load whose nesting differs reads the saved common state and rebuilds it in this run's
nesting before dist_checkpointing merges the loaded tensors into it (:class:`_ConvertedCommon`):

- each param group of this run's optimizers takes the saved group megatron-core would match it
  to (``param_group_identifier_keys``: weight-decay and lr multipliers, decoupled lr), with
  ``is_expert_parallel`` re-marked for this run (EP 1 -> 2 splits the saved groups: the
  expert optimizer's group takes the dense group of the same key; 2 -> 1 merges them);
- the other entries are the chain's shared ones and are copied.

Refused in one line (every rank; docs/MOE.md, Checkpoints): the nesting differs and the
tensors are not keyed by parameter (the ``dp_reshardable`` format, or a checkpoint saved
before the metadata was stored, whose chained keys carry ``chained_<i>.`` prefixes); a merge of
saved entries or groups that differ (e.g. the dense and expert grad scalers after an overflow in
one of them); a param group of this run the checkpoint has no group for.
"""

from __future__ import annotations

import copy

import torch

from megatron.core.dist_checkpointing.strategies.base import LoadCommonStrategy
from megatron.core.dist_checkpointing.validation import verify_checkpoint_and_load_strategy
from megatron.core.optimizer.optimizer import param_group_identifier_keys
from megatron.varlen_training.checkpoint.sharding import (
    AVOID_PREFIX_KEY, FULLY_RESHARDABLE, SHARDING_TYPE_KEY,
)
from megatron.varlen_training.errors import CheckpointError
from megatron.varlen_training.optimizer_kernels import chained_optimizers

OPTIMIZER_KEY = "optimizer"  # the optimizer's entry of a checkpoint (layout.sharded_state_dict)
PARAM_GROUPS = "param_groups"
EXPERT_MARK = "is_expert_parallel"
# What megatron-core matches a loaded param group on, less the expert mark this module re-sets.
MATCH_KEYS = tuple(key for key in param_group_identifier_keys if key != EXPERT_MARK)
_NO_LOAD_OPTIM = "or add --no-load-optim to load the weights only"


def _is_chain(state) -> bool:
    """A ChainedOptimizer's common state: one entry per optimizer, keyed by its index."""
    return isinstance(state, dict) and bool(state) and all(isinstance(k, int) for k in state)


def _parts(state: dict) -> list[dict]:
    """Each optimizer's common state, in chain order."""
    return [state[index] for index in sorted(state)] if _is_chain(state) else [state]


def _groups_holder(part: dict) -> dict:
    """The dict holding ``param_groups``: the part itself (megatron-core's FP32Optimizer) or
    its ``optimizer`` entry (the mixed-precision and the distributed optimizer)."""
    return part if PARAM_GROUPS in part else part[OPTIMIZER_KEY]


def _groups_holder_for(part: dict, like: dict) -> dict:
    """Where ``part`` (a saved part without its groups) holds its groups, as ``like`` does."""
    return part if PARAM_GROUPS in like else part[OPTIMIZER_KEY]


def _without_groups(part: dict) -> dict:
    shared = copy.deepcopy(part)
    del _groups_holder(shared)[PARAM_GROUPS]
    return shared


def _equal(one, other) -> bool:
    """Equality of plain checkpoint data, tensors by value."""
    if isinstance(one, dict) and isinstance(other, dict):
        return one.keys() == other.keys() and all(_equal(one[k], other[k]) for k in one)
    if isinstance(one, (list, tuple)) and isinstance(other, (list, tuple)):
        return len(one) == len(other) and all(map(_equal, one, other))
    if torch.is_tensor(one) or torch.is_tensor(other):
        return torch.is_tensor(one) and torch.is_tensor(other) and torch.equal(one, other)
    return type(one) is type(other) and one == other


def _describe(group: dict) -> str:
    return ", ".join(f"{key} {group.get(key)}" for key in MATCH_KEYS)


def _shared_entries(parts: list[dict]) -> dict:
    """The entries besides the param groups, which the chained optimizers share."""
    shared = _without_groups(parts[0])
    for part in parts[1:]:
        if not _equal(shared, _without_groups(part)):
            raise CheckpointError(
                f"--load: the checkpoint's dense and expert optimizers hold different states "
                f"besides their param groups (e.g. their grad scalers), which the one "
                f"optimizer of --expert-model-parallel-size 1 cannot hold both of (resume with "
                f"--expert-model-parallel-size > 1, {_NO_LOAD_OPTIM})")
    return shared


def _saved_group_for(target: dict, saved_groups: list[dict]) -> dict:
    """A copy of the saved group megatron-core would match ``target`` to, re-marked for it;
    groups of the same key merge only where they agree besides the mark."""
    key = tuple(target[name] for name in MATCH_KEYS)
    found = [group for group in saved_groups
             if tuple(group.get(name) for name in MATCH_KEYS) == key]
    if not found:
        have = "; ".join(sorted({_describe(group) for group in saved_groups}))
        raise CheckpointError(
            f"--load: the checkpoint's optimizer state has no param group with "
            f"{_describe(target)} for this run's parameters (it has: {have}); resume with the "
            f"checkpoint's param-group settings, {_NO_LOAD_OPTIM}")
    unmarked = [{k: v for k, v in group.items() if k != EXPERT_MARK} for group in found]
    if not all(_equal(unmarked[0], other) for other in unmarked[1:]):
        raise CheckpointError(
            f"--load: the checkpoint's dense and expert param groups with {_describe(target)} "
            f"differ besides the expert mark, so they do not merge into one (resume with "
            f"--expert-model-parallel-size > 1, {_NO_LOAD_OPTIM})")
    same_mark = [group for group in found if group.get(EXPERT_MARK) == target[EXPERT_MARK]]
    group = copy.deepcopy((same_mark or found)[0])
    group[EXPERT_MARK] = target[EXPERT_MARK]
    return group


def _check_keyed_by_parameter(metadata: dict) -> None:
    """Only tensors keyed by parameter at every EP size follow a change of the chain."""
    if not metadata.get(AVOID_PREFIX_KEY):
        raise CheckpointError(
            "--load: the checkpoint was saved before its optimizer format was stored, when "
            "the tensors of chained optimizers (EP > 1) were keyed with megatron-core's "
            "chained_<i>. prefixes and a single optimizer's (EP 1) were not, so its optimizer "
            "state does not follow a change of --expert-model-parallel-size between 1 and > 1 "
            f"(resume with the saved size and save again, then change it; {_NO_LOAD_OPTIM})")
    sharding_type = metadata.get(SHARDING_TYPE_KEY)
    if sharding_type not in (None, FULLY_RESHARDABLE):
        raise CheckpointError(
            f"--load: the checkpoint's distributed optimizer state ({sharding_type} format) "
            f"does not follow a change of --expert-model-parallel-size between 1 and > 1 "
            f"(resume with the saved size, {_NO_LOAD_OPTIM}; a save with "
            f"--dist-ckpt-optim-fully-reshardable follows it)")


def convert(state: dict, targets: list[list[dict]], metadata: dict) -> dict:
    """``state`` (a checkpoint's common optimizer state) in the nesting of ``targets`` (this
    run's optimizers' param groups, in chain order); unchanged where the nestings agree.
    ``metadata``: the optimizer metadata the checkpoint was saved with (:mod:`.sharding`)."""
    parts = _parts(state)
    if len(parts) == len(targets):
        return state
    _check_keyed_by_parameter(metadata)
    shared = _shared_entries(parts)
    saved_groups = [group for part in parts for group in _groups_holder(part)[PARAM_GROUPS]]
    converted = []
    for groups in targets:
        part = copy.deepcopy(shared)
        _groups_holder_for(part, parts[0])[PARAM_GROUPS] = [
            _saved_group_for(target, saved_groups) for target in groups]
        converted.append(part)
    return converted[0] if len(targets) == 1 else dict(enumerate(converted))


def target_groups(optimizer) -> list[list[dict]]:
    """This run's param groups per chained optimizer (megatron-core's torch optimizer's, which
    carry the keys a load matches on)."""
    return [list(getattr(getattr(opt, "optimizer", None), PARAM_GROUPS, None) or [])
            for opt in chained_optimizers(optimizer)]


class _ConvertedCommon(LoadCommonStrategy):
    """megatron-core's common load strategy for a checkpoint, serving its common state as
    converted once (:func:`converting_strategy`)."""

    def __init__(self, inner: LoadCommonStrategy, common: dict):
        self._inner, self._common = inner, common

    def load_common(self, checkpoint_dir):
        return self._common

    def load_sharded_objects(self, sharded_objects_state_dict, checkpoint_dir):
        return self._inner.load_sharded_objects(sharded_objects_state_dict, checkpoint_dir)

    def load_sharded_metadata(self, checkpoint_dir):
        return self._inner.load_sharded_metadata(checkpoint_dir)

    def check_backend_compatibility(self, loaded_backend):
        return self._inner.check_backend_compatibility(loaded_backend)

    def check_version_compatibility(self, loaded_version):
        return self._inner.check_version_compatibility(loaded_version)

    @property
    def can_handle_sharded_objects(self):
        return self._inner.can_handle_sharded_objects


def converting_strategy(folder: str, optimizer, metadata: dict) -> LoadCommonStrategy | None:
    """The common load strategy that gives ``folder``'s optimizer state in ``optimizer``'s
    nesting, or None where it is saved in it (megatron-core's own strategy then reads it)."""
    _, inner = verify_checkpoint_and_load_strategy(folder)
    common = inner.load_common(folder)
    saved = common.get(OPTIMIZER_KEY)
    if saved is None:
        return None
    targets = target_groups(optimizer)
    if len(_parts(saved)) == len(targets):
        return None
    common[OPTIMIZER_KEY] = convert(saved, targets, metadata)
    return _ConvertedCommon(inner, common)
