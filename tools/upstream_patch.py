#!/usr/bin/env python
"""Our default_dynamic_cp as a git format-patch series for a Megatron-LM checkout, tested there.

    python tools/upstream_patch.py --megatron ~/Megatron-LM [--out DIR] [--report DIR]

Writes the series (0000-cover-letter.patch and three patches; they add the scheduler as
``--sequence-packing-scheduler lpt_dynamic_cp``) into --out, generated from this repository's
scheduler code with the checkout's own lines as context. Then, unless --no-test, in scratch
clones of the checkout (the checkout itself is never written): applies the series with
``git am``, runs upstream's scheduler and packing tests before and after plus the series' own
tests (test by test; what cannot run here is listed as not run), and re-runs the benchmark's
batches through the patched tree's scheduler. --report writes REPORT.md and tests.md. Exit 0
if all of that held, 1 if not, 2 for bad input.

Upstream's tests import the checkout's whole package: run this with a Python that has what it
needs (torch, numpy, pytest, triton, ...; extra paths through PYTHONPATH).
"""

from __future__ import annotations

if not __package__:  # run as `python tools/X.py`: the repository root on sys.path
    import _repo_root  # noqa: F401

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from tools.upstream_port.benchmark_rows import RESULTS, load_results
from tools.upstream_port.report import Outcome, render_report, render_test_table, stdout_lines
from tools.upstream_port.reproduce import reproduce
from tools.upstream_port.series import TESTS, SeriesError, build_series, git, scratch_clone
from tools.upstream_port.upstream_edits import UpstreamLayoutError
from tools.upstream_port.upstream_tests import (
    compare,
    foreign_paths,
    run_pytest,
    upstream_test_files,
)
from tools.upstream_port.vendor import VendorError
from tools.upstream_schedulers import KNOWN_GOOD_COMMIT

PROG = "upstream_patch.py"
DEFAULT_OUT = "build/upstream_patch"
AM_IDENTITY = ("-c", "user.name=upstream_patch.py", "-c", "user.email=upstream-patch@localhost")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--megatron", required=True, metavar="PATH",
                        help="a Megatron-LM git checkout (dev, d48bd6be0a85 or newer); only read")
    parser.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                        help=f"where the series is written (default {DEFAULT_OUT})")
    parser.add_argument("--results", default=str(RESULTS), metavar="PATH",
                        help="the benchmark's results.json with an upstream comparison")
    parser.add_argument("--work", default=None, metavar="DIR",
                        help="scratch clones go here (default: a new temporary folder, removed "
                             "at the end)")
    parser.add_argument("--report", default=None, metavar="DIR",
                        help="also write REPORT.md and tests.md there (e.g. results/"
                             "upstream_patch)")
    parser.add_argument("--no-test", action="store_true",
                        help="only write the series")
    return parser


def _apply(checkout: Path, work: Path, base: str, patches: list[Path]) -> tuple[Path, str]:
    """A second scratch clone with the series applied by ``git am``: (tree, 'yes' or why not)."""
    tree = work / "patched"
    scratch_clone(checkout, tree, base)
    try:
        git(tree, *AM_IDENTITY, "am", "--quiet", *map(str, patches[1:]))
    except SeriesError as error:
        return tree, f"no ({error})"
    return tree, "yes"


def _test(checkout: Path, work: Path, outcome: Outcome, results: dict) -> None:
    baseline = work / "baseline"
    scratch_clone(checkout, baseline, outcome.base)
    patched, outcome.applied = _apply(checkout, work, outcome.base, outcome.patches)
    if outcome.applied != "yes":
        return
    new = tuple(TESTS.values())
    files = upstream_test_files(baseline, exclude=new)
    before = run_pytest(baseline, files, work / "baseline.xml", work / "shim")
    not_passing = tuple(test for test, result in before.items() if result.status != "passed")
    after = run_pytest(patched, files + list(new), work / "patched.xml", work / "shim",
                       deselect=not_passing)
    outcome.tests = compare(before, after, new)
    outcome.reproductions = reproduce(patched, results)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    checkout = Path(args.megatron).expanduser().resolve()
    work = Path(args.work).resolve() if args.work else Path(tempfile.mkdtemp(prefix="upstream-"))
    try:
        if args.work and work.exists() and any(work.iterdir()):
            raise SeriesError(f"--work {work}: not empty")
        work.mkdir(parents=True, exist_ok=True)
        results = load_results(Path(args.results))
        base, patches = build_series(checkout, work, Path(args.out).resolve(), results)
        print(f"{PROG}: wrote {len(patches)} files to {args.out} (against {base[:12]})")
        outcome = Outcome(" ".join(["python tools/upstream_patch.py", *(argv or sys.argv[1:])]),
                          str(checkout), base, sys.executable, patches, foreign_paths())
        if args.no_test:
            return 0
        _test(checkout, work, outcome, results)
    except UpstreamLayoutError as error:
        print(f"{PROG}: error: {error} (--megatron needs a Megatron-LM dev checkout with "
              f"default_dynamic_cp, e.g. {KNOWN_GOOD_COMMIT})", file=sys.stderr)
        return 2
    except (SeriesError, VendorError, ValueError) as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    print("\n".join(stdout_lines(outcome)))
    if args.report:
        report = Path(args.report)
        report.mkdir(parents=True, exist_ok=True)
        (report / "REPORT.md").write_text(render_report(outcome), encoding="utf-8")
        (report / "tests.md").write_text(render_test_table(outcome), encoding="utf-8")
    return 0 if outcome.ok() else 1


if __name__ == "__main__":
    sys.exit(main())
