"""Joining the job's process group, and the first thing every rank does in it: agree on the
start-up errors of ranks that failed before the group existed.

Under torchrun a rank that exits is seen by the agent, which stops the others. Without an agent
(srun, or a plain ``python pretrain_gpt.py`` per rank with RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT set, rank 0 hosting the store), a rank that exits at a bad flag leaves the others in
``init_process_group`` until the timeout (10 minutes), then a traceback; and its one error line
is lost unless it is rank 0 (only rank 0 prints what every rank is assumed to share). So a rank
whose flags fail joins the group all the same (:func:`report_start_up_error`), and every rank
that joins makes :func:`errors.agree_on_errors` on its start-up error its first collective:
every rank stops with the one line, printed once, exit code 2. The entry points join as soon as
their flags are parsed (:func:`peers_joined_at_start_up`), before megatron-core is imported, so
that a bad start-up fails fast on every rank. Ctrl-C while a rank waits for its peers ends
the wait at once, in one line (exit code 130): the join runs in a thread of its own.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from datetime import timedelta
from typing import NoReturn

import torch

from megatron.varlen.platform import cpu_device
from megatron.varlen_training.errors import (INTERRUPTED_EXIT_CODE, ONE_LINE_ERRORS,
                                              USAGE_EXIT_CODE, agree_on_errors,
                                              exit_on_user_errors, flush_standard_streams,
                                              print_error_line, release_process_group)

# A collective that waits longer than this is a bug (a rank died or diverged): fail, don't hang.
DISTRIBUTED_TIMEOUT = timedelta(minutes=10)
LOOPBACK = "127.0.0.1"
ANY_PORT = 0  # bound with port 0, a socket gets a port the OS picks, held from that moment
# What env:// reads: a process that has them all is one rank of a job its launcher started.
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# How often the main thread wakes while the join waits for peers in a thread of its own: Python
# runs a Ctrl-C handler in the main thread between bytecodes, never inside the store's C++ wait,
# so a join waited in the main thread heard Ctrl-C only at the timeout (10 minutes).
INTERRUPT_POLL_SECONDS = 0.2


def initialize_distributed(timeout_minutes: float | None = None,
                           start_up_error: Exception | None = None,
                           backend: str | None = None) -> None:
    """Joins the process group torchrun set up (RANK/WORLD_SIZE/MASTER_*) over ``backend``
    (``--distributed-backend``; default the device's: nccl on CUDA, gloo on CPU).

    Without RANK (a plain ``python pretrain_gpt.py``) the run is a 1-rank job whose group
    meets at a store it hosts on a port the OS picks (the store torchrun would give it, minus a
    fixed MASTER_PORT): two such runs on one machine never compete for a port.

    ``timeout_minutes`` (``--distributed-timeout-minutes``) bounds how long a collective waits
    for a peer that neither answers nor closes its connection (a killed peer is reported at
    once); default :data:`DISTRIBUTED_TIMEOUT`. ``start_up_error``: this rank's own, shared in
    the first collective (module docstring); any rank's is raised on every rank.
    """
    cpu_device.activate()
    _join(timeout_minutes, start_up_error, backend)


def _join(timeout_minutes: float | None, start_up_error: Exception | None,
          backend: str | None = None) -> None:
    """:func:`initialize_distributed` without the CPU device layer (megatron-core needs it, the
    process group does not: joining before megatron-core is imported leaves its import as it
    was)."""
    if torch.distributed.is_initialized():
        return
    _use_local_device()
    timeout = DISTRIBUTED_TIMEOUT if timeout_minutes is None else timedelta(minutes=timeout_minutes)
    backend = backend or cpu_device.get_backend()
    if "RANK" in os.environ:  # torchrun (or a launcher like it): env://
        _wait_for_peers(timeout, backend)
        agree_on_errors(_raise, start_up_error)  # every joining rank's first collective
        return
    # RANK stays unset (every reader defaults to rank 0 of 1): a later initialisation in this
    # process, after a teardown, is a 1-rank job again with a store of its own.
    store = torch.distributed.TCPStore(LOOPBACK, ANY_PORT, world_size=1, is_master=True,
                                       timeout=timeout)  # the process group keeps it alive
    torch.distributed.init_process_group(backend=backend, store=store, rank=0, world_size=1,
                                         timeout=timeout)
    _raise(start_up_error)


def _use_local_device() -> None:
    """On GPUs, this rank's device (LOCAL_RANK) for the calling thread (CUDA's current device
    is per thread)."""
    if not cpu_device.use_cpu():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))


def _wait_for_peers(timeout: timedelta, backend: str) -> None:
    """``init_process_group`` over env:// in a thread, the main thread waiting on it so that
    Ctrl-C ends the wait at once: a KeyboardInterrupt whose message says what was interrupted
    (:func:`errors.exit_on_user_errors` prints it). The join's own errors are raised here."""
    outcome: list[BaseException] = []

    def join() -> None:
        try:
            _use_local_device()
            torch.distributed.init_process_group(backend=backend, timeout=timeout)
        except BaseException as err:  # noqa: BLE001 -- handed to the main thread as it is
            outcome.append(err)

    thread = threading.Thread(target=join, name="join-process-group", daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(INTERRUPT_POLL_SECONDS)
    except KeyboardInterrupt:
        raise KeyboardInterrupt(
            f"interrupted by Ctrl-C (SIGINT) while rank {os.environ['RANK']} waited for the "
            f"other ranks of the job (WORLD_SIZE {os.environ.get('WORLD_SIZE')}) to join: "
            f"nothing ran yet") from None
    if outcome:
        raise outcome[0]


def _raise(error: Exception | None) -> None:
    if error is not None:
        raise error


def has_peers_waiting() -> bool:
    """This process is one rank of several that a launcher started, with no group yet: the
    others will wait for it in ``init_process_group``."""
    if not all(name in os.environ for name in LAUNCHER_VARIABLES):
        return False
    return int(os.environ["WORLD_SIZE"]) > 1 and not torch.distributed.is_initialized()


@contextlib.contextmanager
def peers_joined_at_start_up(prog: str, timeout_minutes: float | None,
                             backend: str | None = None):
    """For entry points, once their flags are parsed and before they import megatron-core
    (seconds per rank): with peers waiting, joins the process group and agrees on start-up
    errors on entering. A peer whose flags failed has joined to report them
    (:func:`report_start_up_error`); it and this rank then end in its one line at once, exit
    code 2, instead of after this rank's imports. The group joined here is released on leaving
    (the trainer releases only a group it created); without peers waiting (a 1-rank run, or a
    group that already exists) nothing happens. ``timeout_minutes``:
    ``--distributed-timeout-minutes`` and ``backend`` ``--distributed-backend``, as in
    :func:`initialize_distributed`.
    """
    if not has_peers_waiting():
        yield
        return
    # As when the trainer joined: a peer's start-up error, a lost peer or Ctrl-C while waiting
    # for the others end in one line.
    with exit_on_user_errors(prog):
        _join(timeout_minutes, start_up_error=None, backend=backend)
    try:
        yield
    finally:
        release_process_group()


def report_start_up_error(prog: str, error: Exception) -> NoReturn:
    """Ends this rank for ``error`` (a bad flag, before the process group exists): with peers
    waiting, after joining them and agreeing, so every rank ends in the same line, printed
    once; without, as ``<prog>: error: <message>`` on rank 0. Exit code 2."""
    if has_peers_waiting():
        try:
            _join(None, start_up_error=error)
        except ONE_LINE_ERRORS as agreed:  # this rank's error, or that of a lower rank
            print_error_line(prog, agreed)
            _leave(agreed.exit_code)
        except KeyboardInterrupt as interrupted:  # Ctrl-C while waiting for the peers
            print_error_line(prog, interrupted)
            _leave(INTERRUPTED_EXIT_CODE)
        except Exception:  # noqa: BLE001 -- the peers cannot be reached: say it here
            print_error_line(prog, error, every_rank=True)
            _leave(USAGE_EXIT_CODE)
    print_error_line(prog, error)  # every rank parsed the same flags: rank 0 speaks
    _leave(USAGE_EXIT_CODE)


def _leave(code: int) -> NoReturn:
    release_process_group()
    flush_standard_streams()
    sys.exit(code)
