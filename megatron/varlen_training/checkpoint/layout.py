"""What a checkpoint is, for the save and the load paths alike: Megatron-LM's folder layout
(``<root>/iter_0000003/``, the tracker file naming the latest) and the sharded state dict
megatron-core saves and fills: each model chunk's, the iteration, and the optimizer state and
LR/WD schedule laid out as :mod:`.sharding`'s metadata says."""

from __future__ import annotations

from megatron.core.transformer.utils import ensure_metadata_has_dp_cp_group
from megatron.varlen_training import load_options
from megatron.varlen_training.errors import CheckpointError
from megatron.varlen_training.model import unwrap

TRACKER_FILENAME = load_options.TRACKER_FILENAME  # latest_checkpointed_iteration.txt
checkpoint_dir = load_options.iteration_folder  # root, iteration -> <root>/iter_0000003
# Megatron-LM's key of the floating-point operations trained so far, beside the iteration in
# the checkpoint's common state (megatron-core's common.pt); a checkpoint without it counts 0.
FLOPS_SO_FAR_KEY = "num_floating_point_operations_so_far"


def model_keys(model) -> list[str]:
    """The checkpoint key of each model chunk: ``model``, or ``model0``, ``model1``, ... with
    virtual pipeline stages (Megatron-LM's names)."""
    return ["model"] if len(model) == 1 else [f"model{i}" for i in range(len(model))]


def model_sharded_state_dict(chunk) -> dict:
    """A model chunk's sharded state dict, with the metadata megatron-core's GPTModel reads
    (its DP x CP group: an MTP stage without the embedding ties its embedding copy with it;
    without the metadata every such save failed)."""
    return unwrap(chunk).sharded_state_dict(metadata=ensure_metadata_has_dp_cp_group(None))


def sharded_state_dict(model, optimizer, scheduler, iteration: int, is_loading: bool,
                       metadata: dict, with_optimizer: bool = True) -> dict:
    """The model chunks' state, the iteration and (``with_optimizer``) the optimizer state and
    LR/WD schedule, as dist_checkpointing saves them or fills them on load; ``metadata``: how
    the optimizer state is laid out (:mod:`.sharding`)."""
    state = {key: model_sharded_state_dict(chunk)
             for key, chunk in zip(model_keys(model), model)}
    if with_optimizer:
        # Virtual stages keep their own dicts: their local names collide ("decoder.layers.0.*"
        # in every chunk), and a merged dict lost all but the last chunk's parameters, so a
        # save without the distributed optimizer failed (megatron-core walks any nesting).
        model_state = state["model"] if len(model) == 1 else {
            key: state[key] for key in model_keys(model)}
        state["optimizer"] = optimizer.sharded_state_dict(
            model_state, is_loading=is_loading, metadata=metadata)
        state["opt_param_scheduler"] = scheduler.state_dict()
    state["iteration"] = iteration
    return state


def read_latest_iteration(root: str) -> int:
    """The iteration named by the tracker file; a one-line CheckpointError if it is unusable."""
    try:
        return load_options.read_latest_iteration(root)
    except load_options.TrackerError as err:
        raise CheckpointError(str(err)) from None
