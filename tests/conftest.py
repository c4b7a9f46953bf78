"""Suite-wide pytest hooks (the helpers live in tests/harness).

Every process a test starts runs on CPU unless the test asks for the GPU
(tests/harness/child_env.py): the suite is designed on CPU, and a child that saw a GPU would
train on CUDA with NCCL. The tests themselves keep this process's view (tests/gpu run here).
"""

import pytest

from tests.harness import child_env
from tests.harness.xdist_threads import share_cores_among_workers


def pytest_configure(config):
    share_cores_among_workers()  # under pytest-xdist: each worker its share of the cores


@pytest.fixture(scope="session", autouse=True)
def children_run_on_cpu():
    """A fixture, not pytest_configure: it runs where the tests run (each xdist worker), after
    the controller started the workers with the GPUs visible."""
    child_env.hide_gpus_from_children()
    yield
    child_env.restore_gpus_for_children()
