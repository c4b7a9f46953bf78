"""Every tool runs from the repository root where users run it: ``python tools/X.py --help``
(and ``python scripts/X.py``, ``python -m tools.<sub>.X`` for the scripts inside tool
packages) in an environment that has the package installed (``pip install -e .``) and nothing
else of this repository on its path; tools/benchmark_schedulers.py rejects a bad checkout in one
line.

The user's environment is made without the dev venv's path entries: the dev venv's
``megatron_varlen_repo_root.pth`` (scripts/setup_env.sh) makes ``tools`` and ``tests``
importable everywhere, and would hide a tool that only works because of it -- a venv made with
``--system-site-packages`` or a plain subprocess still reads it. So each tool runs under
``python -S`` (no ``site``: no ``.pth`` file is read, no user site), with ``PYTHONPATH`` =
a scratch folder that holds only the installed packages of this checkout (``megatron/varlen``,
``megatron/varlen_training``, ``megatron/wrap``, linked; ``megatron`` stays a namespace package
shared with megatron-core) + this interpreter's site-packages (torch, megatron-core, ...). That
is what ``pip install -e .`` gives, minus the ``.pth``: ``tools``/``tests`` are importable only
if the tool makes the repository root importable itself (tools/_repo_root.py). It starts no
installer and needs no network, so it is fast enough for every run of the suite.
"""

import ast
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
TOOLS = REPO / "tools"
TIMEOUT_S = 240
MAX_PARALLEL = 4  # --help imports torch and megatron-core: a few at a time on a small machine
INSTALLED_PACKAGES = ("varlen", "varlen_training", "wrap")  # pyproject's packages under megatron
BOOTSTRAP = "tools/_repo_root.py"


def _is_script(path: Path) -> bool:
    return "__main__" in path.read_text() and path.name != "__main__.py"


def _commands() -> dict[str, list[str]]:
    """{name: argv after the interpreter} of every script: tools/*.py and scripts/*.py by path,
    scripts inside tool packages (tools/<sub>/X.py) as modules, as their docs say."""
    commands = {}
    for folder in (TOOLS, REPO / "scripts"):
        for path in sorted(folder.glob("*.py")):
            if _is_script(path):
                commands[path.name] = [str(path.relative_to(REPO))]
    for path in sorted(TOOLS.glob("*/**/*.py")):
        if _is_script(path):
            module = ".".join(path.relative_to(REPO).with_suffix("").parts)
            commands[path.name] = ["-m", module]
    return commands


@pytest.fixture(scope="module")
def user_environment(tmp_path_factory) -> dict[str, str]:
    """The environment variables of a user's `pip install -e .` without the dev .pth (module
    docstring)."""
    installed = tmp_path_factory.mktemp("installed")
    (installed / "megatron").mkdir()  # no __init__.py: megatron.core comes from site-packages
    for package in INSTALLED_PACKAGES:
        (installed / "megatron" / package).symlink_to(REPO / "megatron" / package)
    path = os.pathsep.join([str(installed), *site.getsitepackages()])
    keep = {key: value for key, value in os.environ.items()
            if key in ("PATH", "HOME", "TMPDIR", "LANG", "OMP_NUM_THREADS")}
    return {**keep, "PYTHONPATH": path, "PYTHONWARNINGS": "ignore"}


def test_the_user_environment_lacks_the_repository(user_environment):
    """The check would prove nothing if ``tools`` or ``tests`` imported there anyway."""
    probe = ("import importlib.util as u; import megatron.varlen_training, megatron.core; "
             "print(u.find_spec('tools'), u.find_spec('tests'))")
    result = subprocess.run([sys.executable, "-S", "-c", probe], cwd="/", env=user_environment,
                            capture_output=True, text=True, timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["None", "None"]


def test_every_tool_answers_help_from_the_repo_root(user_environment):
    commands = _commands()
    assert len(commands) >= 10  # the globs found the tools
    assert "schedule_corpus.py" in commands  # ... and the scripts inside tool packages
    failures, pending = {}, list(commands.items())
    while pending:
        batch, pending = pending[:MAX_PARALLEL], pending[MAX_PARALLEL:]
        runs = {name: subprocess.Popen([sys.executable, "-S", *argv, "--help"], cwd=REPO,
                                       env=user_environment, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)
                for name, argv in batch}
        for name, process in runs.items():
            stdout, stderr = process.communicate(timeout=TIMEOUT_S)
            if process.returncode != 0 or "usage:" not in stdout:
                failures[name] = (process.returncode, stderr.strip().splitlines()[-1:])
    assert failures == {}


def _edits_sys_path(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr == "path" \
                and isinstance(node.value, ast.Name) and node.value.id == "sys":
            return True
    return False


def test_only_the_bootstrap_touches_sys_path():
    offenders = [path.relative_to(REPO).as_posix() for path in sorted(TOOLS.rglob("*.py"))
                 if _edits_sys_path(path)]
    assert offenders == [BOOTSTRAP]


def test_every_tool_script_starts_with_the_bootstrap():
    """The rule tools/_repo_root.py states, for tools that import only the library too (the
    next one to import tools.* then works without knowing why)."""
    missing = []
    for path in sorted(TOOLS.glob("*.py")):
        if _is_script(path):
            guards = [node for node in ast.parse(path.read_text()).body
                      if isinstance(node, ast.If) and "_repo_root" in ast.unparse(node)]
            if not guards or ast.unparse(guards[0].test) != "not __package__":
                missing.append(path.name)
    assert missing == []


def test_bad_upstream_checkout_is_one_line_exit_2(tmp_path):
    missing = tmp_path / "no-such-checkout"
    result = subprocess.run([sys.executable, "tools/benchmark_schedulers.py", "--out",
                             str(tmp_path / "out"), "--upstream-megatron", str(missing)],
                            cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(missing) in lines[0] and "--upstream-megatron" in lines[0]
    assert not (tmp_path / "out").exists()
