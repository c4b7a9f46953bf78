"""The processes a test starts run on CPU unless the test asks for the GPU.

The suite is designed on CPU: a child a test starts (``pretrain_gpt.py``, a tool, ``python
-c``) that saw a GPU would train on CUDA with NCCL (several ranks on one GPU: NCCL refuses) or
take its CUDA-only branches (``--fp16`` is refused only without CUDA, CUDA-only logging). So
for the whole session (tests/conftest.py applies it, in the process that runs the tests:
each pytest-xdist worker), :func:`hide_gpus_from_children`

1. fixes this process's own view first (the CUDA driver reads ``CUDA_VISIBLE_DEVICES`` once,
   when it initialises): in-process tests (tests/gpu, the CUDA-sensitive subset) keep the GPU;
2. sets ``CUDA_VISIBLE_DEVICES=""`` in ``os.environ``: every child that inherits the
   environment (also multiprocessing's forkserver and spawned processes) sees no GPU;
3. gives the same default to a child started with an explicit ``env=`` (many tests pass a
   minimal one, ``{"PATH": ..., "PYTHONPATH": ...}``, which would otherwise show every GPU):
   ``subprocess.Popen`` adds ``CUDA_VISIBLE_DEVICES=""`` where that env does not set it.

A test that wants its child on the GPU says so: ``env=gpu_child_env()`` (the launcher's
original visibility, marked so that step 3 leaves it alone), or, for processes started by
multiprocessing (the multi-rank harness's CUDA ranks), ``with gpus_visible_to_children():``
around their start. Without the session hiding (a script using the harness), both leave the
environment as it is.
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
from typing import Iterator, Mapping

GPU_VISIBILITY = "CUDA_VISIBLE_DEVICES"
HIDDEN = ""
# In an env made by gpu_child_env(): the child sees what the launcher saw; the Popen default
# must not hide it (the launcher may have had no CUDA_VISIBLE_DEVICES at all: all GPUs).
GPU_CHILD_MARK = "VARLEN_TEST_CHILD_SEES_GPU"

# The CUDA driver cannot work without it: where it is missing no GPU can be visible, and this
# process need not import torch (~3 s of CPU) to fix its view.
NVIDIA_CONTROL_DEVICE = "/dev/nvidiactl"
# Popen.__init__'s parameters before ``env`` (args, bufsize, ..., cwd): an env passed by
# position is left alone (nobody does).
_POPEN_PARAMS_BEFORE_ENV = 10

_hiding = False
_original: str | None = None  # the launcher's CUDA_VISIBLE_DEVICES (None: unset)
_popen_init_before = subprocess.Popen.__init__


def hide_gpus_from_children() -> None:
    """Hides GPUs from every child this process starts from now on (this process keeps its
    own view). Undone by :func:`restore_gpus_for_children`."""
    global _hiding, _original
    if _hiding:
        return
    _fix_own_cuda_view()
    _original = os.environ.get(GPU_VISIBILITY)
    os.environ[GPU_VISIBILITY] = HIDDEN
    os.environ.pop(GPU_CHILD_MARK, None)  # a GPU child's own children hide the GPUs again
    _wrap_popen()
    _hiding = True


def restore_gpus_for_children() -> None:
    """Gives children the launcher's original visibility again."""
    global _hiding
    if not _hiding:
        return
    subprocess.Popen.__init__ = _popen_init_before
    _set_visibility(os.environ, _original)
    _hiding = False


def gpu_child_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """An environment (``base``, default ``os.environ``) for a child that must see the GPUs
    this process was started with."""
    env = dict(os.environ if base is None else base)
    if _hiding:
        _set_visibility(env, _original)
    env[GPU_CHILD_MARK] = "1"
    return env


@contextlib.contextmanager
def gpus_visible_to_children() -> Iterator[None]:
    """Within the block, processes that inherit this process's environment (multiprocessing's
    spawn start) see the launcher's GPUs: set before their interpreter starts, so before
    anything in them can initialise CUDA (unpickling a test module may already ask)."""
    if not _hiding:
        yield
        return
    _set_visibility(os.environ, _original)
    try:
        yield
    finally:
        os.environ[GPU_VISIBILITY] = HIDDEN


def cpu_default(env: Mapping[str, str] | None) -> Mapping[str, str] | None:
    """``env`` as a child will get it: hidden GPUs unless it says otherwise. None (inherit
    ``os.environ``, where GPUs are hidden already) stays None."""
    if env is None or GPU_VISIBILITY in env or GPU_CHILD_MARK in env:
        return env
    return {**env, GPU_VISIBILITY: HIDDEN}


def _fix_own_cuda_view() -> None:
    # torch.cuda.init() initialises the driver (which reads CUDA_VISIBLE_DEVICES then). torch
    # caches its device count only when asked after that, and torch 2.11 (the GPU machine's)
    # counts through NVML, which reads the environment, until it is cached: asked first after
    # the hiding, it answered 0 here too (H100 run 6, "Invalid device id" in a tests/gpu
    # worker; torch 2.13 asks the driver once initialised). So the count is asked now.
    if "torch" not in sys.modules and not os.path.exists(NVIDIA_CONTROL_DEVICE):
        return
    import torch

    if torch.cuda.is_available():
        torch.cuda.init()
        torch.cuda.device_count()


def _set_visibility(env: dict | os._Environ, value: str | None) -> None:
    if value is None:
        env.pop(GPU_VISIBILITY, None)
    else:
        env[GPU_VISIBILITY] = value


def _wrap_popen() -> None:
    global _popen_init_before
    _popen_init_before = real_init = subprocess.Popen.__init__

    @functools.wraps(real_init)
    def init_on_cpu(self, *args, **kwargs):
        if len(args) <= _POPEN_PARAMS_BEFORE_ENV:  # env not among them: by keyword or absent
            kwargs["env"] = cpu_default(kwargs.get("env"))
        return real_init(self, *args, **kwargs)

    subprocess.Popen.__init__ = init_on_cpu
