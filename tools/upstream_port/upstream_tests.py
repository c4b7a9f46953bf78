"""Upstream's tests before and after the series, on this machine, test by test.

Which tests: every upstream unit-test file that names what the series touches
(``UPSTREAM_TEST_NAMES``), run first on the unpatched scratch tree (the baseline), then on the
patched tree together with the series' own tests. A test that does not pass on the baseline
here (it needs CUDA, NCCL, Transformer Engine or several GPUs, or was skipped) is *not run* on
the patched tree and is listed with the baseline's reason; every other test must pass.

Pytest runs in the tree itself with the tree first on PYTHONPATH (so ``megatron`` is the
tree's, not an installed megatron-core), upstream's addopts dropped (its ``-x`` would stop at
the first CUDA test), results read from JUnit XML.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

from tools.upstream_port.vendor import REPO

UPSTREAM_TEST_NAMES = re.compile(r"data_schedule|sequence_packing_scheduler|"
                                 r"dynamic_context_parallel|default_dynamic_cp|"
                                 r"model_parallel_config")
TEST_ROOT = "tests/unit_tests"
PYTEST_TIMEOUT_S = 1800
# Upstream's megatron/training uses typing.override (Python 3.12) although its pyproject asks
# for >= 3.10; on an older interpreter the runner provides it from typing_extensions.
TYPING_SHIM = '''import typing

if not hasattr(typing, "override"):
    try:
        from typing_extensions import override as _override
    except ImportError:
        pass
    else:
        typing.override = _override
'''
PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


@dataclass(frozen=True)
class Outcome:
    """One test's result: passed, failed (failure or error) or skipped, and why."""

    status: str
    reason: str = ""


@dataclass(frozen=True)
class TestRow:
    """One line of the table: test id, verdict ('pass', 'FAIL', 'not run') and detail."""

    test: str
    verdict: str
    detail: str
    new: bool = False


def upstream_test_files(tree: Path, exclude: tuple[str, ...] = ()) -> list[str]:
    """Upstream's unit-test files that name something the series touches."""
    files = []
    for path in sorted((tree / TEST_ROOT).rglob("test_*.py")):
        relative = path.relative_to(tree).as_posix()
        if relative not in exclude and UPSTREAM_TEST_NAMES.search(
                path.read_text(encoding="utf-8", errors="replace")):
            files.append(relative)
    return files


def _node_id(classname: str, name: str, files: list[str]) -> str:
    """pytest's node id of a JUnit test case (its class name is the dotted module[.Class])."""
    for file in files:
        module = file[:-len(".py")].replace("/", ".")
        if classname == module or classname.startswith(module + "."):
            rest = classname[len(module) + 1:]
            return f"{file}::{rest + '::' if rest else ''}{name}"
    return f"{classname}::{name}"


def parse_junit(path: Path, files: list[str]) -> dict[str, Outcome]:
    """Node id -> outcome for every test case of a JUnit XML report."""
    outcomes = {}
    for case in ElementTree.parse(path).iter("testcase"):
        status, reason = PASSED, ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                status = SKIPPED if child.tag == "skipped" else FAILED
                reason = (child.get("message") or child.tag).strip().splitlines()[0][:160] \
                    if (child.get("message") or "").strip() else child.tag
                break
        outcomes[_node_id(case.get("classname", ""), case.get("name", ""), files)] = \
            Outcome(status, reason)
    return outcomes


def foreign_paths() -> list[str]:
    """The caller's PYTHONPATH without this repository (whose ``megatron`` is not upstream's)."""
    entries = (os.environ.get("PYTHONPATH") or "").split(os.pathsep)
    return [entry for entry in entries if entry and Path(entry).resolve() != REPO]


def run_pytest(tree: Path, files: list[str], report: Path, shim: Path,
               deselect: tuple[str, ...] = (), python: str = sys.executable) -> dict[str, Outcome]:
    """Runs ``files`` in ``tree``; node id -> outcome (empty if pytest could not start; its
    output is kept beside ``report`` as .log)."""
    if not files:
        return {}
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "sitecustomize.py").write_text(TYPING_SHIM, encoding="utf-8")
    path = os.pathsep.join([str(tree), str(shim), *foreign_paths()])
    command = [python, "-m", "pytest", "-q", "-o", "addopts=", "-p", "no:cacheprovider",
               f"--junitxml={report}", *files, *(f"--deselect={test}" for test in deselect)]
    try:
        result = subprocess.run(command, cwd=tree, env={**os.environ, "PYTHONPATH": path},
                                capture_output=True, text=True, timeout=PYTEST_TIMEOUT_S)
        log = result.stdout + result.stderr
    except subprocess.TimeoutExpired:
        log = f"pytest did not finish in {PYTEST_TIMEOUT_S} s"
    report.with_suffix(".log").write_text(log, encoding="utf-8")
    return parse_junit(report, files) if report.is_file() else {}


def compare(baseline: dict[str, Outcome], patched: dict[str, Outcome],
            new_files: tuple[str, ...]) -> list[TestRow]:
    """The table: upstream's tests (baseline vs patched), then the series' own."""
    rows = []
    for test, before in sorted(baseline.items()):
        if before.status != PASSED:
            rows.append(TestRow(test, "not run", f"{before.status} without the series here: "
                                                 f"{before.reason}"))
            continue
        after = patched.get(test, Outcome(FAILED, "did not run on the patched tree"))
        rows.append(TestRow(test, "pass" if after.status == PASSED else "FAIL",
                            "" if after.status == PASSED else f"{after.status}: {after.reason}"))
    for test, after in sorted(patched.items()):
        if test in baseline:
            continue
        # The series' tests, and anything else new on the patched tree (a collection error).
        verdict = {PASSED: "pass", SKIPPED: "not run"}.get(after.status, "FAIL")
        rows.append(TestRow(test, verdict, after.reason,
                            new=test.split("::")[0] in new_files))
    return rows


def counts(rows: list[TestRow], new: bool) -> dict[str, int]:
    """Verdict -> number of rows (upstream's tests or the series' own)."""
    out = {"pass": 0, "FAIL": 0, "not run": 0}
    for row in rows:
        if row.new == new:
            out[row.verdict] += 1
    return out
