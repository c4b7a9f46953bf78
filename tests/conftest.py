"""Suite-wide pytest hooks (the helpers live in tests/harness)."""

from tests.harness.xdist_threads import share_cores_among_workers


def pytest_configure(config):
    share_cores_among_workers()  # under pytest-xdist: each worker its share of the cores
