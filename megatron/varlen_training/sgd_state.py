"""``--optimizer sgd`` through a checkpoint load: megatron-core 0.16.1 builds torch's SGD with
no ``init_state_fn``, yet its FP32Optimizer / Float16Optimizer call that function when they
build the loading template of their state, so every resume of an SGD run failed with
``'NoneType' object is not callable`` (measured). :func:`install_sgd_state_init` gives them
one that creates torch SGD's state (a ``momentum_buffer`` per parameter, zeros: the values are
placeholders the load overwrites)."""

from __future__ import annotations

import torch

from megatron.varlen_training.optimizer_kernels import chained_optimizers


def _init_sgd_state(optimizer: torch.optim.SGD, config=None) -> None:
    del config  # megatron-core's signature
    for group in optimizer.param_groups:
        if group["momentum"] == 0:  # torch keeps no momentum buffer then
            continue
        for param in group["params"]:
            state = optimizer.state[param]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(param.data)


def install_sgd_state_init(megatron_optimizer) -> int:
    """Sets the state initialiser of every torch SGD inside ``megatron_optimizer`` (chained
    or not) that has none; returns how many were set."""
    installed = 0
    for opt in chained_optimizers(megatron_optimizer):
        if isinstance(getattr(opt, "optimizer", None), torch.optim.SGD) \
                and getattr(opt, "init_state_fn", None) is None:
            opt.init_state_fn = _init_sgd_state
            installed += 1
    return installed
