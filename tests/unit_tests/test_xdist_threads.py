"""Under pytest-xdist each worker takes its share of the cores for torch's threads
(tests/harness/xdist_threads.py, applied by tests/conftest.py)."""

import os

import pytest
import torch

from tests.harness.xdist_threads import worker_threads


def test_a_worker_takes_its_share_of_the_cores():
    assert worker_threads({"PYTEST_XDIST_WORKER_COUNT": "8"}, 16) == 2
    assert worker_threads({"PYTEST_XDIST_WORKER_COUNT": "12"}, 16) == 1
    assert worker_threads({"PYTEST_XDIST_WORKER_COUNT": "4"}, 2) == 1  # never zero


def test_outside_xdist_or_with_the_users_choice_nothing_changes():
    assert worker_threads({}, 16) is None
    assert worker_threads({"PYTEST_XDIST_WORKER_COUNT": "8", "OMP_NUM_THREADS": "4"}, 16) is None


def test_an_xdist_worker_runs_on_its_share():
    """The worker's torch threads are the share tests/conftest.py set (or the user's own
    OMP_NUM_THREADS), and the processes it starts inherit it."""
    if "PYTEST_XDIST_WORKER_COUNT" not in os.environ:
        pytest.skip("only under pytest-xdist (-n N): the rule is for its workers")
    assert torch.get_num_threads() == int(os.environ["OMP_NUM_THREADS"])
