"""Run a function on N gloo ranks from pytest (or any script), with a deadline.

    results = run_distributed(my_rank_fn, world_size=4, args=(cfg,), timeout_s=120)

``my_rank_fn`` must be importable by name (defined at module level). Each rank runs in its own
process with ``torch.distributed`` initialised (gloo, loopback), one intra-op thread, and
RANK/WORLD_SIZE/LOCAL_RANK set. The ranks meet at a store the launcher hosts on a port it already
holds (tests/harness/rendezvous.py): no port is chosen first and bound later, so no other
process can take it in between ("address already in use" under load).

The device is an explicit argument, never an accident of the machine: ``device="cpu"`` (the
default) runs CPU ranks with the CPU device layer forced on, even when a GPU is visible (CUDA
is never initialised, GPUs are hidden from the ranks' own children); ``device="cuda"`` runs
the ranks on the visible GPUs (round-robin, so several ranks may share one GPU) over gloo with
CUDA tensors, from freshly spawned interpreters (a CUDA context cannot cross a fork) that see
the launcher's GPUs also under pytest, where the suite hides them from every other child
(tests/harness/child_env.py).

The call returns the per-rank return values in rank order, or raises
:class:`DistributedTestError` carrying every failing rank's traceback. Children are always
reaped: each rank leads its own process group and the launcher kills every group when the run
ends (so helpers a rank started, such as dist_checkpointing's writer processes, go too), and a
rank whose launcher disappears exits by itself, with what it started (no orphans holding ports
or memory; the forkserver and multiprocessing's resource tracker then end too).

Processes come from a ``forkserver`` that preloads torch and megatron-core once, so a launch
costs a fork instead of a full interpreter start (start-up dominates on a 2-core machine). What a
CPU rank starts itself (``--num-workers``' DataLoader workers) is forked, as under torchrun.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import queue as queue_module
import signal
import sys
import threading
import time
import traceback
from datetime import timedelta
from typing import Any, Callable

from tests.harness.child_env import GPU_VISIBILITY, HIDDEN, gpus_visible_to_children
from tests.harness.rendezvous import hosted_store

DEFAULT_TIMEOUT_S = 180.0
# After the first rank fails, the others are usually stuck in a collective: give them this long
# to report their own error before they are killed.
FAILURE_GRACE_S = 3.0
ORPHAN_POLL_S = 1.0
CHILD_JOIN_S = 5.0
POLL_S = 0.05
SIGNAL_EXIT_BASE = 128  # a shell reports a command a signal ended as 128 + the signal number
_PRELOAD = [
    "torch",
    "torch.distributed",
    "megatron.core.parallel_state",
    "megatron.core.models.gpt.gpt_model",
    "megatron.core.pipeline_parallel.schedules",
    "megatron.core.optimizer",
    "megatron.core.distributed",
    # What nearly every rank imports next, when it unpickles its test function (the test module
    # imports pytest and tests/harness/training_runs.py): the training layer is ~200 modules,
    # about 3 s of CPU per rank (each rank compiling the same sources where no .pyc is
    # written), which made most of a tiny training launch. Imported here once, a fork inherits
    # them. They are imported before the rank activates its device layer either way. Not the
    # hybrid (Mamba) model: it installs a triton stand-in where triton is missing.
    "pytest",
    "megatron.varlen.platform.cpu_device",
    "megatron.varlen_training.pretrain",
    "megatron.varlen_training.trainer",
    "megatron.varlen_training.config.from_flags",
    "megatron.varlen_training.model_family",
]
_CONTEXT = None
CPU, CUDA = "cpu", "cuda"
CHILD_START_METHOD = "fork"  # Linux's default, what a rank under torchrun uses
# Ranks exchange tensors over gloo on either device: NCCL needs one GPU per rank. gloo carries
# CUDA tensors for single collectives (all-reduce, all-gather, broadcast) but not for the
# coalesced ones megatron-core's DDP issues, so CUDA ranks over gloo reduce gradients one bucket
# at a time (megatron/varlen/platform/gloo_cuda.py); it has no send/recv for CUDA tensors (no PP
# here).
RANK_BACKEND = "gloo"
_HIDE_GPUS = {GPU_VISIBILITY: HIDDEN}


class DistributedTestError(RuntimeError):
    """A rank raised, died, or the run exceeded its deadline."""


def _get_context():
    global _CONTEXT
    if _CONTEXT is None:
        # Children must find the same modules as the launcher (tests are imported by path).
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in [*sys.path, os.environ.get("PYTHONPATH", "")] if p
        )
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(_PRELOAD)
    return _CONTEXT


def _spawn_context():
    _get_context()  # the same PYTHONPATH hand-over
    return multiprocessing.get_context("spawn")


def check_device(device: str) -> None:
    """Raises ValueError for a device the harness cannot run ranks on."""
    if device not in (CPU, CUDA):
        raise ValueError(f"run_distributed device must be {CPU!r} or {CUDA!r}, got {device!r}")
    if device == CUDA:
        import torch

        if not torch.cuda.is_available():
            raise ValueError("run_distributed(device='cuda') needs a visible CUDA device")


def prepare_rank_device(device: str, rank: int) -> str:
    """Makes this rank's device choice effective; returns the process-group backend.

    CPU: forces the CPU device layer (CUDA is then never initialised here, even when visible)
    and hides GPUs from anything this rank starts. CUDA: binds the rank to GPU
    ``rank % device_count``.
    """
    import torch

    from megatron.varlen.platform import cpu_device

    if device == CPU:
        os.environ.update(_HIDE_GPUS)
        cpu_device.force_cpu()
        cpu_device.activate()
    else:
        torch.cuda.set_device(rank % torch.cuda.device_count())
    return RANK_BACKEND


def _exit_when_orphaned(parent_pid: int, launcher_pid: int) -> None:
    """Ends this rank's process group (the rank and the helpers it started) once its launcher
    is gone. The parent is the forkserver for CPU ranks, not the launcher: a launcher killed
    by a signal its code cannot catch (SIGKILL; SIGTERM by default) leaves the forkserver
    alive, and the forkserver lives as long as any rank holds its end of the pipe that tells
    it its clients are gone -- every rank does, so a rank watching only its parent would wait
    forever (and so would the forkserver and multiprocessing's resource tracker)."""
    while True:
        time.sleep(ORPHAN_POLL_S)
        if os.getppid() != parent_pid or not process_alive(launcher_pid):
            os.killpg(0, signal.SIGKILL)


def _stop_own_children() -> None:
    """Ends helpers a rank started (e.g. dist_checkpointing's spawn Manager for async writes):
    os._exit below skips the finalizers that would stop them."""
    for child in multiprocessing.active_children():
        child.terminate()
        child.join(timeout=CHILD_JOIN_S)


def _rank_main(fn, rank, world_size, meeting, args, kwargs, results, timeout_s, device,
               launcher_pid):
    # Lead a process group of our own: the launcher kills the whole group when it reaps us, so
    # no grandchild survives a failed or timed-out run.
    os.setpgid(0, 0)
    threading.Thread(target=_exit_when_orphaned, daemon=True,
                     args=(os.getppid(), launcher_pid)).start()
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size), **meeting,
    )
    import torch

    torch.set_num_threads(1)
    if device == CPU:
        # What the rank starts itself (--num-workers' DataLoader workers) is forked, as in a
        # process torchrun starts on Linux: the forkserver method this process inherited would
        # start a fresh interpreter per rank for them (7 s of a 0.7 s 2-rank run).
        multiprocessing.set_start_method(CHILD_START_METHOD, force=True)
    try:
        backend = prepare_rank_device(device, rank)
        # env://, as under torchrun: the meeting's variables make every rank a client of the
        # launcher's store.
        torch.distributed.init_process_group(
            backend=backend, init_method="env://",
            rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s),
        )
        # Every rank has joined before any runs fn: a rank that finishes fast and exits closes
        # its connections under a peer still joining (gloo's "Connection closed by peer").
        torch.distributed.barrier()
        # Plain pickle bytes: torch's multiprocessing reducer would pass tensors as shared
        # memory that must outlive this process, and the rank exits right after reporting.
        results.put((rank, True, pickle.dumps(fn(*args, **kwargs))))
    except BaseException:  # report everything, including SystemExit from argparse
        results.put((rank, False, traceback.format_exc()))
    finally:
        results.close()
        results.join_thread()
        _stop_own_children()
        os._exit(0)  # skip atexit handlers that may wait on peers that are gone


def _start(procs, device: str) -> None:
    if device == CPU:
        for proc in procs:
            proc.start()
        return
    # Spawned CUDA ranks start from this environment, where the suite hides the GPUs from
    # children (tests/harness/child_env.py): give them the launcher's own.
    with gpus_visible_to_children():
        for proc in procs:
            proc.start()


def _collect(procs, results, world_size, timeout_s) -> dict[int, tuple[bool, Any]]:
    deadline = time.monotonic() + timeout_s
    collected: dict[int, tuple[bool, Any]] = {}
    failed_at = None
    while len(collected) < world_size:
        now = time.monotonic()
        if now > deadline or (failed_at is not None and now - failed_at > FAILURE_GRACE_S):
            break
        try:
            rank, ok, payload = results.get(timeout=POLL_S)
            collected[rank] = (ok, pickle.loads(payload) if ok else payload)
            if not ok and failed_at is None:
                failed_at = time.monotonic()
        except queue_module.Empty:
            dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if dead and failed_at is None and not any(r in collected for r in dead):
                failed_at = time.monotonic()
    return collected


def _reap(procs) -> None:
    """Kills every started rank's process group (the rank and anything it started), then joins.
    Ranks never started (an exception, e.g. Ctrl-C, while starting them) are left out."""
    started = [proc for proc in procs if proc.pid is not None]
    for proc in started:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # the rank and all its children are already gone
    for proc in started:
        proc.join(timeout=10)


def run_distributed(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple = (),
    kwargs: dict | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    device: str = CPU,
) -> list[Any]:
    """Runs ``fn(*args, **kwargs)`` on ``world_size`` gloo ranks and returns their results.

    ``device`` is ``"cpu"`` (CPU ranks, also where a GPU is visible) or ``"cuda"`` (ranks
    sharing the visible GPUs, CUDA tensors over gloo).

    Raises:
        DistributedTestError: a rank raised (its traceback is in the message), a rank died
            without reporting, or the deadline passed (all ranks are killed in every case).
    """
    check_device(device)
    ctx = _get_context() if device == CPU else _spawn_context()
    results = ctx.Queue()
    with hosted_store() as meeting:
        procs = [
            ctx.Process(target=_rank_main, args=(fn, rank, world_size, meeting, args,
                                                 kwargs or {}, results, timeout_s, device,
                                                 os.getpid()))
            for rank in range(world_size)
        ]
        try:
            _start(procs, device)
            collected = _collect(procs, results, world_size, timeout_s)
        finally:
            _reap(procs)
    failures = [(r, payload) for r, (ok, payload) in sorted(collected.items()) if not ok]
    if failures:
        # Every failing rank: the first to fail is often only a peer of the real culprit
        # (e.g. gloo "connection reset" after another rank raised).
        report = "\n".join(f"--- rank {rank} of {world_size} failed:\n{tb}"
                           for rank, tb in failures)
        silent = sorted(set(range(world_size)) - set(collected))
        if silent:
            report += (f"\n--- ranks {silent} never reported (exit codes "
                       f"{[procs[r].exitcode for r in silent]}; negative = killed by signal)")
        raise DistributedTestError(f"{len(failures)} of {world_size} ranks failed\n{report}")
    missing = sorted(set(range(world_size)) - set(collected))
    if missing:
        codes = [procs[r].exitcode for r in missing]
        how = (f"exited without reporting (exit codes {codes}; negative = killed by signal)"
               if all(code not in (None, -signal.SIGKILL) for code in codes)
               else f"did not finish within {timeout_s:.0f} s (killed; exit codes {codes})")
        raise DistributedTestError(f"ranks {missing} of {world_size} {how}")
    return [collected[rank][1] for rank in range(world_size)]


def reap_runs_on_sigterm() -> None:
    """For scripts that launch runs one after another (tools/probe_*.py): SIGTERM (``kill``, a
    job scheduler's stop) unwinds like Ctrl-C, so the run in progress is reaped at once (its
    ranks' process groups killed) and the script exits with 143 (128 + SIGTERM). By default
    SIGTERM ends the script on the spot; its ranks then notice within ``ORPHAN_POLL_S``. A
    second SIGTERM ends the script on the spot. Call it from the main thread."""
    signal.signal(signal.SIGTERM, _exit_for_sigterm)


def _exit_for_sigterm(signum, frame) -> None:
    del frame
    signal.signal(signum, signal.SIG_DFL)  # the clean-up itself must stay interruptible
    raise SystemExit(SIGNAL_EXIT_BASE + signum)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie has exited, merely not yet waited for)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split()[2] != "Z"
