"""Process-level set-up: device layer, torch.distributed (process_group.py), megatron parallel
state, seeds."""

from __future__ import annotations

import random

import numpy as np
import torch

from megatron.core import parallel_state
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
from megatron.varlen_training.arguments import format_arguments
from megatron.varlen_training.config import ModelConfig, MoEConfig, ParallelConfig, RunConfig
from megatron.varlen_training.errors import UserInputError
from megatron.varlen_training.log import print_rank_0
from megatron.varlen_training.process_group import initialize_distributed
from megatron.varlen_training.varlen_arguments import precision_dtype
from megatron.varlen.platform import destroy_dynamic_cp_groups, gloo_cuda


def initialize_model_parallel(parallel: ParallelConfig, moe: MoEConfig | None = None) -> None:
    """Creates megatron-core's TP/PP/CP/DP groups for the run's parallel sizes (and the expert
    groups of ``moe``: EP, expert TP, expert DP)."""
    destroy_megatron_core_state()
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=parallel.tensor_model_parallel_size,
        pipeline_model_parallel_size=parallel.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=parallel.virtual_pipeline_model_parallel_size,
        context_parallel_size=parallel.context_parallel_size,
        expert_model_parallel_size=moe.expert_model_parallel_size if moe else 1,
        expert_tensor_parallel_size=moe.expert_tensor_parallel_size if moe else None,
    )


def check_gradient_overlap(parallel: ParallelConfig) -> None:
    """Refuses --overlap-grad-reduce / --overlap-param-gather where the process group cannot
    overlap them (CUDA ranks over gloo: ``gloo_cuda.overlap_refusal``): one line at start-up,
    exit code 2, instead of a traceback at the first gradient reduction."""
    refusal = gloo_cuda.overlap_refusal_here(parallel.overlap_grad_reduce,
                                             parallel.overlap_param_gather)
    if refusal is not None:
        raise UserInputError(refusal)  # every rank has the same device and backend


def set_random_seeds(seed: int) -> None:
    """Python, numpy, torch and megatron's tracked RNG streams (CPU tracker on CPU).

    Weights do not depend on these streams (see layout_invariant_init.py); dropout does, and the
    tracked streams keep it reproducible and distinct across TP ranks as Megatron intends.
    """
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)


def initialize_megatron(run: RunConfig) -> None:
    """Everything a training process needs before the model is built."""
    initialize_distributed(run.parallel.distributed_timeout_minutes,
                           backend=run.parallel.distributed_backend)
    check_gradient_overlap(run.parallel)
    initialize_model_parallel(run.parallel, run.model.moe)
    set_random_seeds(run.training.seed)
    print_rank_0(virtual_stages_line(run.parallel))  # in Megatron-LM's order
    print_rank_0(parameters_dtype_line(run.model))
    print_rank_0(format_arguments(run.flag_values))  # Megatron-LM's start-up dump, once


def virtual_stages_line(parallel: ParallelConfig) -> str:
    """Megatron-LM's start-up line naming the virtual pipeline size, whatever flag gave it (its
    validate_args prints it on every run: None without a virtual pipeline)."""
    size = parallel.virtual_pipeline_model_parallel_size
    return f"Number of virtual stages per pipeline stage: {size}"


def parameters_dtype_line(model: ModelConfig) -> str:
    """Megatron-LM's start-up line naming the parameters' dtype (its validate_args prints it)."""
    return f"using {precision_dtype(model.bf16, model.fp16)} for parameters ..."


def teardown_parallel_state() -> None:
    """Destroys the dynamic CP groups and megatron-core's parallel state with its process groups
    (the default process group, which the caller may own, stays)."""
    destroy_dynamic_cp_groups()
    destroy_megatron_core_state()


def destroy_megatron_core_state() -> None:
    """megatron-core's parallel state and the process groups it made for it.

    megatron-core 0.16.1's ``destroy_model_parallel`` forgets its groups without destroying them
    (all but its gloo copies), so every run in a long-lived process (a script making several
    ``MegatronWrap``s, the test harness's launches) would leave its groups alive (17 per rank at
    CP 2 x EP 2 on 2 ranks), each with gloo's threads or an NCCL communicator. megatron-core
    records the groups this rank is in, as it makes them, in ``_global_process_group_list`` (its
    list for ``update_pg_timeout``; ``None`` there is the default group): those are destroyed
    first, and ``destroy_model_parallel`` skips a gloo copy that is gone already. A release
    without the list gets the old behaviour (nothing breaks, the groups stay). Where the process
    group has ended already (a user error ends it first: ``errors.release_process_group``),
    every group went with it."""
    if not parallel_state.model_parallel_is_initialized():
        return
    made = getattr(parallel_state, "_global_process_group_list", None) or []
    if torch.distributed.is_initialized():
        for group in {id(group): group for group in made if group is not None}.values():
            torch.distributed.destroy_process_group(group)
    parallel_state.destroy_model_parallel()


def shutdown() -> None:
    """Tears down parallel state and the process group (tests launch many runs per process)."""
    teardown_parallel_state()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
