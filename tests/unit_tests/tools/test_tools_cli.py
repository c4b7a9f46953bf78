"""Every tool runs as ``python tools/X.py --help`` from the repository root, with no sys.path
edit in the tool (the dev environment makes ``tools`` and ``tests`` importable, see
scripts/setup_env.sh), and tools/benchmark_schedulers.py rejects a bad checkout in one line."""

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
TOOLS = REPO / "tools"
TIMEOUT_S = 240


def _scripts() -> list[Path]:
    """tools/*.py files that are run as programs (they have a __main__ block)."""
    return sorted(path for path in TOOLS.glob("*.py") if "__main__" in path.read_text())


def _edits_sys_path(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr == "path" \
                and isinstance(node.value, ast.Name) and node.value.id == "sys":
            return True
    return False


def test_no_tool_touches_sys_path():
    offenders = [path.relative_to(REPO).as_posix() for path in sorted(TOOLS.rglob("*.py"))
                 if _edits_sys_path(path)]
    assert offenders == []


def test_every_tool_answers_help_from_the_repo_root():
    scripts = _scripts()
    assert len(scripts) >= 8  # the glob found the tools
    runs = {path.name: subprocess.Popen([sys.executable, str(path.relative_to(REPO)), "--help"],
                                        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True)
            for path in scripts}
    failures = {}
    for name, process in runs.items():
        stdout, stderr = process.communicate(timeout=TIMEOUT_S)
        if process.returncode != 0 or f"usage: {name}" not in stdout:  # its own name
            failures[name] = (process.returncode, stderr.strip().splitlines()[-1:])
    assert failures == {}


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
