"""Generates the series: a scratch clone of the user's checkout, three commits, format-patch.

The clone shares the checkout's objects (``git clone --shared``) and never writes to it. Each
commit writes code generated here (vendor.py, templates/) or edits upstream's files where
upstream_edits.py finds their places, so the diff's context lines are the checkout's own. The
commits carry the megatron-varlen commit's author and date, so the same two commits always give
the same series, byte for byte.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tools.upstream_port import upstream_edits as edits
from tools.upstream_port.cover_letter import SUBJECT, cover_letter_body
from tools.upstream_port.sample_id_groups import SCHEDULER_NAME
from tools.upstream_port.vendor import REPO, TEMPLATES, file_header, package_dir, package_files

GIT_TIMEOUT_S = 600
HEADER_SOURCE = edits.SCHEDULE_FILE  # whose first line gives upstream's file header
TESTS = {"core": "tests/unit_tests/data/test_lpt_dynamic_cp.py",
         "scheduler": "tests/unit_tests/data/test_lpt_dynamic_cp_scheduler.py",
         "config": "tests/unit_tests/test_lpt_dynamic_cp_config.py"}
COVER_LETTER = "0000-cover-letter.patch"


class SeriesError(ValueError):
    """The checkout cannot take the series (one line: what is wrong)."""


def git(cwd: Path, *args: str, env: dict | None = None) -> str:
    """Runs git in ``cwd``; SeriesError with git's last line if it fails."""
    result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                            timeout=GIT_TIMEOUT_S, env={**os.environ, **(env or {})})
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise SeriesError(f"git {args[0]} in {cwd} failed: {last}")
    return result.stdout.strip()


@dataclass(frozen=True)
class Source:
    """The megatron-varlen commit the series is generated from."""

    describe: str
    author: str
    email: str
    date: str

    @property
    def year(self) -> int:
        return int(self.date[:4])

    def git_env(self) -> dict:
        return {"GIT_AUTHOR_NAME": self.author, "GIT_AUTHOR_EMAIL": self.email,
                "GIT_AUTHOR_DATE": self.date, "GIT_COMMITTER_NAME": self.author,
                "GIT_COMMITTER_EMAIL": self.email, "GIT_COMMITTER_DATE": self.date}


def our_source(repo: Path = REPO) -> Source:
    author, email, date = git(repo, "log", "-1", "--format=%an%n%ae%n%aI").splitlines()
    describe = git(repo, "describe", "--always", "--dirty", "--abbrev=12")
    return Source(f"megatron-varlen {describe}", author, email, date)


def check_checkout(path: Path) -> str:
    """The checkout's HEAD commit; SeriesError if ``path`` is not a Megatron-LM git checkout."""
    if not (path / HEADER_SOURCE).is_file():
        raise SeriesError(f"--megatron {path}: not a Megatron-LM checkout ({HEADER_SOURCE} "
                          "not found)")
    try:
        return git(path, "rev-parse", "--verify", "HEAD^{commit}")
    except (SeriesError, OSError):
        raise SeriesError(f"--megatron {path}: not a git checkout with a commit") from None


def scratch_clone(checkout: Path, dest: Path, commit: str) -> None:
    """A clone of ``checkout`` at ``commit`` in ``dest``, sharing its objects read-only."""
    git(dest.parent, "clone", "--quiet", "--shared", "--no-checkout", str(checkout), str(dest))
    git(dest, "checkout", "--quiet", "--detach", commit)


@dataclass(frozen=True)
class Commit:
    subject: str
    body: str
    apply: Callable[[Path, str, Source], None]  # (tree, header, source)


def _write(tree: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = tree / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def _test_file(name: str, header: str) -> dict[str, str]:
    return {TESTS[name]: header + (TEMPLATES / f"{Path(TESTS[name]).name}.tmpl").read_text(
        encoding="utf-8")}


def _package(tree: Path, header: str, source: Source) -> None:
    _write(tree, {**package_files(header, source.describe), **_test_file("core", header)})


def _scheduler(tree: Path, header: str, source: Source) -> None:
    edits.edit_file(tree, edits.SCHEDULE_FILE, edits.edit_data_schedule)
    _write(tree, _test_file("scheduler", header))


def _config(tree: Path, header: str, source: Source) -> None:
    for relative, edit in ((edits.CONFIG_FILE, edits.edit_model_parallel_config),
                           (edits.TRANSFORMER_CONFIG_FILE, edits.edit_transformer_config),
                           (edits.ARGUMENTS_FILE, edits.edit_arguments)):
        edits.edit_file(tree, relative, edit)
    _write(tree, _test_file("config", header))


COMMITS = (
    Commit(f"datasets: add {SCHEDULER_NAME}, a dynamic-CP packing scheduler package",
           f"A pure Python and numpy package under {package_dir()}/: every sample gets a CP "
           "group size of its own and each microbatch is packed longest first onto the "
           "least-loaded group, the room left filled by best fit, balancing an estimated "
           "per-rank time under max_seqlen_per_dp_cp_rank on padded tokens. Generated from "
           "megatron-varlen (see the package's __init__.py); nothing else uses it yet.",
           _package),
    Commit(f"datasets: add LptDynamicCPScheduler ('{SCHEDULER_NAME}') to the scheduler map",
           "A DpBalancedScheduler subclass with is_dynamic_cp set, so run() and the data path "
           "stay as they are; get_groups_and_subsamples() returns every DPxCP rank at least one "
           "sample per microbatch, on groups parallel_state creates. wrap_data_iterator passes "
           "min_dynamic_context_parallel_size and the model config (the cost model's sizes).",
           _scheduler),
    Commit(f"Accept sequence_packing_scheduler='{SCHEDULER_NAME}' with dynamic context "
           "parallelism",
           f"ModelParallelConfig's field and --sequence-packing-scheduler list "
           f"{SCHEDULER_NAME}; dynamic context parallelism accepts it beside "
           f"{edits.UPSTREAM_DYNAMIC}, which stays the default.",
           _config),
)


def _message(commit: Commit) -> str:
    import textwrap

    return commit.subject + "\n\n" + "\n".join(textwrap.wrap(commit.body, 72)) + "\n"


def build_series(checkout: Path, work: Path, out: Path, results: dict,
                 source: Source | None = None) -> tuple[str, list[Path]]:
    """Writes the series for ``checkout`` into ``out`` (clone in ``work/generate``); returns the
    base commit and the patch files, cover letter first."""
    source = source or our_source()
    base = check_checkout(checkout)
    tree = work / "generate"
    scratch_clone(checkout, tree, base)
    header = file_header((tree / HEADER_SOURCE).read_text(encoding="utf-8").splitlines()[0],
                         source.year)
    for commit in COMMITS:
        commit.apply(tree, header, source)
        git(tree, "add", "--all")
        git(tree, "commit", "--quiet", "--no-verify", "-m", _message(commit),
            env=source.git_env())
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.patch"):
        stale.unlink()
    names = git(tree, "format-patch", "--cover-letter", "--no-signature",
                f"--base={base}", "-o", str(out), f"{base}..HEAD",
                env=source.git_env()).splitlines()  # the cover letter's date too
    letter = out / COVER_LETTER
    letter.write_text(letter.read_text(encoding="utf-8")
                      .replace("*** SUBJECT HERE ***", SUBJECT)
                      .replace("*** BLURB HERE ***", cover_letter_body(results, source.describe,
                                                                       base)), encoding="utf-8")
    return base, [Path(name) for name in names]
