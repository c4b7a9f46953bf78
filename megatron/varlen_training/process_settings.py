"""Process-wide settings of Megatron-LM's runtime flags (config/runtime.py): the Python logging
level, deterministic mode and --disable-jit-fuser, applied by the Trainer when it starts.
Deterministic mode's library settings must also precede the entry points' process-group join (NCCL,
cuBLAS and Transformer Engine read them from the environment when they start): the entry points
apply them right after parsing, and the Trainer's second application changes nothing."""

from __future__ import annotations

import os

import torch

from megatron.varlen.platform import cpu_device
from megatron.varlen_training import log
from megatron.varlen_training.config.runtime import LOGGING_LEVEL_VARIABLE, RuntimeConfig

# Megatron-LM main's --deterministic-mode values (megatron/training/determinism.py), set where
# the environment leaves them unset (runtime_arguments refused contrary values at start-up):
# ring all-reduces sum in a fixed order, TE's attention uses deterministic kernels, cuBLAS a
# fixed workspace.
DETERMINISTIC_ENV = {
    "NCCL_ALGO": "Ring",
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0",
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
}


def resolved_logging_level(flag_level: int | None, env=os.environ) -> int | None:
    """Megatron-LM's order: ``--logging-level``, else $MEGATRON_LOGGING_LEVEL, else None
    (leave the levels as they are)."""
    if flag_level is not None:
        return flag_level
    from_env = env.get(LOGGING_LEVEL_VARIABLE)
    return int(from_env) if from_env else None


def apply_logging_level(level: int) -> None:
    """Megatron-LM's --logging-level (:func:`log.set_process_log_level`), and its line."""
    log.set_process_log_level(level)
    log.print_rank_0(f"Setting logging level to {level}")  # Megatron-LM's line


def apply_deterministic_mode() -> None:
    """What Megatron-LM's --deterministic-mode does to the process: the library settings of
    :data:`DETERMINISTIC_ENV` where unset, then ``torch.use_deterministic_algorithms(True)``
    (megatron-core reads ``TransformerConfig.deterministic_mode``: model.py sets it)."""
    for name, value in DETERMINISTIC_ENV.items():
        os.environ.setdefault(name, value)
    torch.use_deterministic_algorithms(True)


def disable_jit_fusion() -> None:
    """--disable-jit-fuser: megatron-core's jit-fused functions run eagerly. Megatron-LM rebinds
    ``megatron.core.jit.jit_fuser``, which reaches only functions decorated afterwards; importing
    megatron.core has already wrapped the MoE router's, bias-GELU's, ... in torch.compile, so
    dynamo's switch turns those off too (they then run their plain Python bodies)."""
    import torch._dynamo

    from megatron.core import jit

    jit.disable_jit_fuser()
    torch._dynamo.config.disable = True


def apply_before_join(runtime: RuntimeConfig) -> None:
    """What must precede the entry points' process-group join and the model's first step:
    deterministic mode's library settings and --disable-jit-fuser (idempotent and silent; the
    Trainer applies them again with the rest)."""
    if runtime.deterministic_mode:
        apply_deterministic_mode()
    if runtime.disable_jit_fuser:
        disable_jit_fusion()


def apply_process_settings(runtime: RuntimeConfig) -> None:
    """The run's logging level (its line printed once, here) and deterministic mode, for this
    process."""
    level = resolved_logging_level(runtime.logging_level)
    if level is not None:
        apply_logging_level(level)
    apply_before_join(runtime)


def joinable_backend(requested: str | None) -> str | None:
    """``--distributed-backend`` for a join made before the flags are checked (the facade's):
    on CPU gloo is the only backend, so the device's is used there and the flag check that
    follows refuses nccl in one line instead of init_process_group failing in a traceback."""
    return None if cpu_device.use_cpu() else requested
