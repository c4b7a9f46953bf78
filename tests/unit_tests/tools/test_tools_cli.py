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
installer and needs no network, and one interpreter answers every tool's ``--help``
(tool_help_driver.py: each tool started as Python would start it alone, the repository's
modules forgotten between tools), so it is fast enough for every run of the suite.
"""

import ast
import json
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
TOOLS = REPO / "tools"
TIMEOUT_S = 240
HELP_DRIVER = Path(__file__).with_name("tool_help_driver.py")
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


@pytest.fixture(scope="module")
def tools_help(user_environment, tmp_path_factory) -> dict:
    """What the user's environment gives (``environment``) and each tool's ``--help``
    (``tools``: exit code, whether stdout shows a usage, stderr's last line), from one
    ``python -S`` process (tool_help_driver.py)."""
    folder = tmp_path_factory.mktemp("tools_help")
    commands, result = folder / "commands.json", folder / "result.json"
    commands.write_text(json.dumps(_commands()))
    done = subprocess.run([sys.executable, "-S", str(HELP_DRIVER), str(commands), str(result)],
                          cwd=REPO, env=user_environment, capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(result.read_text())


def test_the_user_environment_lacks_the_repository(tools_help):
    """The check would prove nothing if ``tools`` or ``tests`` imported there anyway."""
    assert tools_help["environment"] == {"tools": False, "tests": False}


def test_every_tool_answers_help_from_the_repo_root(tools_help):
    answers = tools_help["tools"]
    assert sorted(answers) == sorted(_commands())
    assert len(answers) >= 10  # the globs found the tools
    assert "schedule_corpus.py" in answers  # ... and the scripts inside tool packages
    failures = {name: (answer["code"], answer["stderr_tail"]) for name, answer in answers.items()
                if answer["code"] != 0 or not answer["usage"]}
    assert failures == {}


def _edits_sys_path(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr == "path" \
                and isinstance(node.value, ast.Name) and node.value.id == "sys":
            return True
    return False


# Tools that put another project's checkout on the path (not this repository's root), why.
OTHER_CHECKOUTS = {
    "tools/megatron_lm_flags.py": "runs a Megatron-LM checkout's own parser, its package first",
}


def test_only_the_bootstrap_touches_sys_path():
    offenders = [path.relative_to(REPO).as_posix() for path in sorted(TOOLS.rglob("*.py"))
                 if _edits_sys_path(path)]
    assert offenders == sorted([BOOTSTRAP, *OTHER_CHECKOUTS])


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
