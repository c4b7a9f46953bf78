"""The upstream patch's report: series, git am, upstream's tests before and after, the
series' own tests, the benchmark reproduced in the patched tree (Markdown and a stdout
summary)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tools.upstream_port.reproduce import Reproduction
from tools.upstream_port.upstream_tests import TestRow, counts

NOT_RUN_REASON_WIDTH = 110


@dataclass
class Outcome:
    """What one run of tools/upstream_patch.py found."""

    command: str
    checkout: str
    base: str
    python: str
    patches: list[Path]
    extra_paths: list[str] = field(default_factory=list)
    applied: str = "not tried"
    tests: list[TestRow] = field(default_factory=list)
    reproductions: list[Reproduction] = field(default_factory=list)

    def ok(self) -> bool:
        """git am applied, no test failed, every reproduction equal."""
        return (self.applied == "yes" and not any(row.verdict == "FAIL" for row in self.tests)
                and all(item.equal for item in self.reproductions))


def _files_table(rows: list[TestRow]) -> list[str]:
    per_file: dict[str, Counter] = {}
    for row in rows:
        per_file.setdefault(row.test.split("::")[0], Counter())[row.verdict] += 1
    lines = ["| test file | pass | FAIL | not run |", "|---|---:|---:|---:|"]
    for name, tally in per_file.items():
        lines.append(f"| `{name}` | {tally['pass']} | {tally['FAIL']} | {tally['not run']} |")
    return lines


def _not_run_reasons(rows: list[TestRow]) -> list[str]:
    reasons = Counter(row.detail[:NOT_RUN_REASON_WIDTH] for row in rows if row.verdict == "not run")
    return [f"- {count} x {reason}" for reason, count in reasons.most_common()]


def _reproduction_table(items: list[Reproduction]) -> list[str]:
    lines = ["| configuration | report: critical path / LB3 | patched tree | equal | "
             "relative difference |", "|---|---:|---:|---|---:|"]
    for item in items:
        lines.append(f"| {item.row.label} | {item.report_ratio} | {item.patched_ratio} | "
                     f"{'yes' if item.equal else 'NO'} | {item.relative_difference:+.2e} |")
    return lines


def _summary_lines(outcome: Outcome) -> list[str]:
    upstream, new = counts(outcome.tests, new=False), counts(outcome.tests, new=True)
    equal = sum(item.equal for item in outcome.reproductions)
    return [f"- Series: {len(outcome.patches) - 1} patches and a cover letter against "
            f"`{outcome.base[:12]}`; `git am` on a scratch clone: {outcome.applied}.",
            f"- Upstream's tests (baseline vs patched): {upstream['pass']} pass, "
            f"{upstream['FAIL']} fail, {upstream['not run']} not run (they do not pass without "
            "the series on this machine).",
            f"- The series' tests: {new['pass']} pass, {new['FAIL']} fail, {new['not run']} "
            "not run.",
            f"- Benchmark in the patched tree: {equal} of {len(outcome.reproductions)} "
            "configurations equal to the report's critical paths (3 decimals)."]


def render_report(outcome: Outcome) -> str:
    """REPORT.md of results/upstream_patch."""
    new_rows = [row for row in outcome.tests if row.new]
    parts = ["# Upstream patch: applied and tested on a Megatron-LM checkout", "",
             f"Command: `{outcome.command}`", "",
             f"Checkout: `{outcome.checkout}` at `{outcome.base}`; tests run with "
             f"`{outcome.python}` (CPU), PYTHONPATH extras: "
             f"{', '.join(f'`{path}`' for path in outcome.extra_paths) or 'none'}.", "",
             "## Summary", *_summary_lines(outcome), "",
             "## Series", *[f"- `{patch.name}`" for patch in outcome.patches], "",
             "## Upstream's tests, per file", *_files_table([row for row in outcome.tests
                                                            if not row.new]), "",
             "Not run (the reason each failed or was skipped without the series):",
             *_not_run_reasons(outcome.tests), "",
             "## The series' tests", "| test | verdict | detail |", "|---|---|---|",
             *[f"| `{row.test}` | {row.verdict} | {row.detail} |" for row in new_rows], "",
             "## Benchmark reproduced in the patched tree", *_reproduction_table(
                 outcome.reproductions), "",
             "Every test, one by one: [tests.md](tests.md).", ""]
    return "\n".join(parts)


def render_test_table(outcome: Outcome) -> str:
    """tests.md: every test with its verdict."""
    lines = ["# Every test: verdict on the patched tree", "", "| test | verdict | detail |",
             "|---|---|---|"]
    lines += [f"| `{row.test}` | {row.verdict} | {row.detail.replace('|', '/')} |"
              for row in outcome.tests]
    return "\n".join(lines) + "\n"


def stdout_lines(outcome: Outcome) -> list[str]:
    """What the tool prints: the summary, each test that ran, the not-run reasons."""
    ran = [f"  {row.verdict:4} {row.test}{'  ' + row.detail if row.detail else ''}"
           for row in outcome.tests if row.verdict != "not run"]
    return [*_summary_lines(outcome), "tests run (pass/FAIL):", *ran,
            "not run (reason):", *_not_run_reasons(outcome.tests),
            "benchmark in the patched tree (report -> patched):",
            *[f"  {item.row.label}: {item.report_ratio} -> {item.patched_ratio}"
              f"{'' if item.equal else '  DIFFERENT'}" for item in outcome.reproductions]]
