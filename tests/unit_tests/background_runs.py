"""Subprocess runs that a test module starts together and checks one test at a time.

A fresh interpreter of the training layer spends ~5 s of one core importing torch and
megatron-core before it does anything else, so a single-process launch leaves the second core of
the suite's 2-core machine idle, and a torchrun leaves both idle while its agent starts and
stops. A module whose tests each launch such a run starts them all at once (a module-scoped
fixture), and each test waits for its own run and asserts on it as before: the same processes,
flags and checks, in about half the serial time.

A module adds each test's case (a function that starts its runs); in a serial session every
case starts at once, under pytest-xdist (whose workers already share the cores) a case starts
when its test asks for it (:meth:`BackgroundRuns.begin`), so that no worker starts runs another
worker's tests check.

Output goes to files (a pipe that nobody reads while the run goes on would block a verbose run).
Runs that share the cores take longer than one alone, so no run is given less time than the
serial order gave it: its own deadline from its start, or, if later, the sum of the deadlines of
the runs started so far (up to :data:`MAX_WAIT_S`) from when the first started. Whatever
still runs when the module ends is killed with all its descendants (torchrun's workers, the
checkpoint writer's helpers).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Mapping

KILL_WAIT_S = 30
# Under pyproject.toml's per-test pytest timeout (600 s), so that a run past its deadline is
# reported here, with its output.
MAX_WAIT_S = 540.0


@dataclass
class BackgroundRun:
    """One started process: its folder (for files the test reads), output files, deadline."""

    name: str
    folder: Path
    proc: subprocess.Popen
    group: BackgroundRuns  # the runs started with it, which share its deadline
    deadline: float  # its own: start + the time it alone would be given
    stdout_path: Path
    stderr_path: Path | None  # None: stderr went to the stdout file
    new_session: bool = False  # the process leads its own session and process group
    _done: subprocess.CompletedProcess | None = field(default=None, repr=False)

    def result(self) -> subprocess.CompletedProcess:
        """Waits for the run (until its deadline); its exit code, stdout and stderr text."""
        if self._done is None:
            try:
                deadline = max(self.deadline, self.group.deadline())
                self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                kill_tree(self.proc, self.new_session)
                raise AssertionError(f"{self.name} ran past its deadline; output tail:\n"
                                     f"{self._read(self.stdout_path)[-3000:]}\n"
                                     f"{self._read(self.stderr_path)[-3000:]}") from None
            self._done = subprocess.CompletedProcess(
                self.proc.args, self.proc.returncode, self._read(self.stdout_path),
                self._read(self.stderr_path))
        return self._done

    @staticmethod
    def _read(path: Path | None) -> str:
        return path.read_text(errors="replace") if path is not None else ""


def runs_together() -> bool:
    """Whether a module's cases start at once: not in a pytest-xdist worker."""
    return "PYTEST_XDIST_WORKER" not in os.environ


class BackgroundRuns:
    """The runs of one module, by name; :meth:`kill_all` when the module ends."""

    def __init__(self, root: Path, together: bool | None = None):
        self.root = root
        self.together = runs_together() if together is None else together
        self._cases: dict[str, Callable[[BackgroundRuns], object]] = {}
        self._started: dict[str, object] = {}
        self._runs: dict[str, BackgroundRun] = {}
        self._first_start: float | None = None
        self._budget_s = 0.0

    def add(self, case: str, start: Callable[[BackgroundRuns], object]) -> None:
        """Registers ``case``: ``start(self)`` starts its runs; now, if the cases run together."""
        self._cases[case] = start
        if self.together:
            self.begin(case)

    def begin(self, case: str) -> object:
        """Starts ``case`` unless it started; returns what its start function returned."""
        if case not in self._started:
            self._started[case] = self._cases[case](self)
        return self._started[case]

    def deadline(self) -> float:
        """When every run of the group must have ended (module docstring)."""
        return self._first_start + min(self._budget_s, MAX_WAIT_S)

    def start(self, name: str, argv: list[str], *, env: dict, timeout_s: float,
              cwd: Path | None = None, merge_stderr: bool = False,
              new_session: bool = False) -> BackgroundRun:
        """Starts ``argv`` now in ``cwd`` (default: the run's own folder, ``root/name``);
        ``timeout_s`` is what the run alone would be given."""
        folder = self.root / name
        folder.mkdir(parents=True, exist_ok=True)
        stdout_path = folder / "stdout.txt"
        stderr_path = None if merge_stderr else folder / "stderr.txt"
        with open(stdout_path, "w") as out, \
                open(stderr_path or os.devnull, "w") as err:
            proc = subprocess.Popen(argv, cwd=cwd or folder, env=env, stdout=out,
                                    stderr=subprocess.STDOUT if merge_stderr else err,
                                    stdin=subprocess.DEVNULL, start_new_session=new_session)
        now = time.monotonic()
        if self._first_start is None:
            self._first_start = now
        self._budget_s += timeout_s
        run = BackgroundRun(name, folder, proc, self, now + timeout_s, stdout_path, stderr_path,
                            new_session)
        self._runs[name] = run
        return run

    def __getitem__(self, name: str) -> BackgroundRun:
        """The run ``name``; a case of that name is started first if it has not."""
        if name in self._cases:
            self.begin(name)
        return self._runs[name]

    def kill_all(self) -> None:
        for run in self._runs.values():
            kill_tree(run.proc, run.new_session)


@contextlib.contextmanager
def started_together(root: Path, cases: Mapping[str, Callable[[BackgroundRuns], object]]
                     ) -> Iterator[BackgroundRuns]:
    """A module's runs: ``cases`` (name: the function starting its runs) added in order; every
    run still going is killed when the block ends (a module-scoped fixture yields from inside
    it)."""
    runs = BackgroundRuns(root)
    try:
        for case, start in cases.items():
            runs.add(case, start)
        yield runs
    finally:
        runs.kill_all()


def kill_tree(proc: subprocess.Popen, new_session: bool = False) -> None:
    """Kills ``proc`` and every descendant (collected before any of them dies, so none is
    reparented away first), and with ``new_session`` its process group (helpers of a process
    that already ended are no longer its descendants); reaps ``proc``."""
    import psutil  # a dependency of this package (megatron-core's checkpoint writer needs it)

    try:
        root = psutil.Process(proc.pid)
        victims = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        victims = []
    if new_session:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    for process in victims:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(victims, timeout=KILL_WAIT_S)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=KILL_WAIT_S)
