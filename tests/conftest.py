"""Suite-wide pytest hooks (the helpers live in tests/harness).

Every process a test starts runs on CPU unless the test asks for the GPU
(tests/harness/child_env.py): the suite is designed on CPU, and a child that saw a GPU would
train on CUDA with NCCL. The tests themselves keep this process's view (tests/gpu run here).
"""

import signal

import pytest

from tests.harness import child_env
from tests.harness.xdist_threads import share_cores_among_workers


def pytest_configure(config):
    share_cores_among_workers()  # under pytest-xdist: each worker its share of the cores
    handle_ctrl_c()


def handle_ctrl_c():
    """A suite started in the background of a non-interactive shell (``make test &``) inherits
    SIGINT ignored, and Python then never raises KeyboardInterrupt -- nor do the processes the
    tests start, which inherit an ignored signal through exec. The Ctrl-C tests need Python's
    own handling: with a handler installed here (in each xdist worker too), children start with
    the default disposition, as from a terminal."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session", autouse=True)
def children_run_on_cpu():
    """A fixture, not pytest_configure: it runs where the tests run (each xdist worker), after
    the controller started the workers with the GPUs visible."""
    child_env.hide_gpus_from_children()
    yield
    child_env.restore_gpus_for_children()
