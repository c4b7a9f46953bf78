"""torch's threads in a pytest-xdist worker: its share of the cores, not all of them.

By default every worker process (and every process it starts) takes all the cores for torch's
intra-op threads, so ``pytest -n N`` oversubscribes the machine N-fold, and tests made of many
tiny operations slow down sharply: the position-table fuzz (tests/unit_tests/reliability/
test_position_table.py) takes 12 s on one thread on a quiet 2-core machine, 19 s on two, and ran
past its 600 s timeout in a ``-n 2`` run beside other busy processes. tests/conftest.py applies
it; an ``OMP_NUM_THREADS`` already set (tools/gpu_check.py sets 1) wins.
"""

from __future__ import annotations

import os


def worker_threads(environ, cores: int) -> int | None:
    """The threads a worker should use (None: not an xdist worker, or the user chose)."""
    workers = environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not workers or "OMP_NUM_THREADS" in environ:
        return None
    return max(1, cores // int(workers))


def share_cores_among_workers() -> None:
    """Sets this worker's threads, and its children's through ``OMP_NUM_THREADS``."""
    threads = worker_threads(os.environ, os.cpu_count() or 1)
    if threads is None:
        return
    import torch

    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)
