"""Process-level set-up: device layer, torch.distributed, megatron parallel state, seeds."""

from __future__ import annotations

import os
import random
from datetime import timedelta

import numpy as np
import torch

from megatron.core import parallel_state
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
from megatron.varlen_training.arguments import format_arguments
from megatron.varlen_training.config import MoEConfig, ParallelConfig, RunConfig
from megatron.varlen_training.errors import UserInputError
from megatron.varlen_training.log import print_rank_0
from megatron.varlen.platform import cpu_device, destroy_dynamic_cp_groups, gloo_cuda

# A collective that waits longer than this is a bug (a rank died or diverged): fail, don't hang.
DISTRIBUTED_TIMEOUT = timedelta(minutes=10)
LOOPBACK = "127.0.0.1"
ANY_PORT = 0  # bound with port 0, a socket gets a port the OS picks, held from that moment


def initialize_distributed(timeout_minutes: float | None = None) -> None:
    """Joins the process group torchrun set up (RANK/WORLD_SIZE/MASTER_*), gloo on CPU.

    Without RANK (a plain ``python pretrain_gpt.py``) the run is a 1-rank job whose group
    meets at a store it hosts on a port the OS picks (the store torchrun would give it, minus a
    fixed MASTER_PORT): two such runs on one machine never compete for a port.

    ``timeout_minutes`` (``--distributed-timeout-minutes``) bounds how long a collective waits
    for a peer that neither answers nor closes its connection (a killed peer is reported at
    once); default :data:`DISTRIBUTED_TIMEOUT`.
    """
    cpu_device.activate()
    if torch.distributed.is_initialized():
        return
    if not cpu_device.use_cpu():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    timeout = DISTRIBUTED_TIMEOUT if timeout_minutes is None else timedelta(minutes=timeout_minutes)
    if "RANK" in os.environ:  # torchrun (or a launcher like it): env://
        torch.distributed.init_process_group(backend=cpu_device.get_backend(), timeout=timeout)
        return
    # RANK stays unset (every reader defaults to rank 0 of 1): a later initialisation in this
    # process, after a teardown, is a 1-rank job again with a store of its own.
    store = torch.distributed.TCPStore(LOOPBACK, ANY_PORT, world_size=1, is_master=True,
                                       timeout=timeout)  # the process group keeps it alive
    torch.distributed.init_process_group(backend=cpu_device.get_backend(), store=store, rank=0,
                                         world_size=1, timeout=timeout)


def initialize_model_parallel(parallel: ParallelConfig, moe: MoEConfig | None = None) -> None:
    """Creates megatron-core's TP/PP/CP/DP groups for the run's parallel sizes (and the expert
    groups of ``moe``: EP, expert TP, expert DP)."""
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
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

    Weights do not depend on these streams (see layout_invariant_init.py); dropout does, and the tracked
    streams keep it reproducible and distinct across TP ranks as Megatron intends.
    """
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)


def initialize_megatron(run: RunConfig) -> None:
    """Everything a training process needs before the model is built."""
    initialize_distributed(run.parallel.distributed_timeout_minutes)
    check_gradient_overlap(run.parallel)
    initialize_model_parallel(run.parallel, run.model.moe)
    set_random_seeds(run.training.seed)
    print_rank_0(format_arguments(run.flag_values))  # Megatron-LM's start-up dump, once


def teardown_parallel_state() -> None:
    """Destroys the dynamic CP groups and megatron-core's parallel state (the process group,
    which the caller may own, stays)."""
    destroy_dynamic_cp_groups()
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()


def shutdown() -> None:
    """Tears down parallel state and the process group (tests launch many runs per process)."""
    teardown_parallel_state()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
