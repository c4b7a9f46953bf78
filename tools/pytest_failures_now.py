"""A pytest plugin that names each failing test the moment it fails: ``-p
tools.pytest_failures_now``.

pytest's ``-rfE`` names failures only in its end summary, so a run killed at its cap (the GPU
check's parts) leaves a log of F's and no names. This prints, at once and flushed, a line like
the summary's for every failed setup, call or teardown:

    FAILED tests/unit_tests/x/test_y.py::test_z - AssertionError: assert 1 == 2

Under pytest-xdist the workers' reports reach the controller's ``pytest_runtest_logreport``;
only the controller prints (a worker's output is not shown).
"""

from __future__ import annotations

import pytest

REASON_CHARS = 200  # one line in the log, as the end summary's


def failure_line(report: pytest.TestReport) -> str:
    """``FAILED <node id> - <first line of the reason>`` (``ERROR`` outside the test's call,
    as pytest's short summary says)."""
    word = "FAILED" if report.when == "call" else "ERROR"
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr or "")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # A crash message starts with the error; a plain text one (a crashed worker) ends with it.
    reason = (lines[0] if crash is not None else lines[-1]) if lines else "(no reason given)"
    return f"{word} {report.nodeid} - {reason[:REASON_CHARS]}"


class _FailuresNow:
    def __init__(self, config: pytest.Config):
        self.config = config

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if not report.failed or reporter is None:  # reporter None: -p no:terminal
            return
        # After the progress letters of the line being written (-q's ensure_newline keeps them).
        start = "\n" if reporter._tw.width_of_current_line else ""
        reporter.write(start + failure_line(report) + "\n", flush=True)


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller, or a run without xdist
        config.pluginmanager.register(_FailuresNow(config), "failures_now")
