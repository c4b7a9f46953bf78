"""Runs every tool's ``--help`` in ONE interpreter, each as Python would start it alone.

test_tools_cli.py starts this file under ``python -S`` in a user's environment (see its
docstring). A separate interpreter per tool paid torch's and megatron-core's import ~30 times;
here the library is imported once and stays cached, while what could let one tool's start
help another's is reset before each: ``sys.path`` is what ``python tools/X.py`` (the script's
folder first) or ``python -m tools.sub.X`` (the working directory first) gives over the
environment's path, and every module loaded from the repository itself (``tools.*``,
``tests.*``, ``_repo_root``) is forgotten, so a tool that does not bootstrap the repository
root (tools/_repo_root.py) fails as it would alone.

Usage: ``python -S tool_help_driver.py COMMANDS_JSON RESULT_JSON``, COMMANDS_JSON: {name:
argv after the interpreter}; RESULT_JSON gets {"environment": {...}, "tools": {name: {"code",
"usage", "stderr_tail"}}}.
"""

import contextlib
import importlib.util
import io
import json
import os
import runpy
import sys
import traceback

REPO = os.getcwd()  # the tools run from the repository root


def _environment() -> dict:
    """Whether the library imports and ``tools``/``tests`` do not (the check is void else)."""
    import megatron.core  # noqa: F401
    import megatron.varlen_training  # noqa: F401

    return {name: importlib.util.find_spec(name) is not None for name in ("tools", "tests")}


def _exit_code(exit: SystemExit) -> int:
    if exit.code is None or isinstance(exit.code, int):
        return exit.code or 0
    print(exit.code, file=sys.stderr)  # sys.exit("message"): the message, status 1
    return 1


def _start(argv: list[str], base_path: list[str]) -> None:
    """``python -S <argv> --help``, in this interpreter."""
    if argv[0] == "-m":
        sys.path[:] = [REPO, *base_path]
        sys.argv = [argv[1], "--help"]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.path[:] = [os.path.dirname(os.path.abspath(argv[0])), *base_path]
        sys.argv = [argv[0], "--help"]
        runpy.run_path(argv[0], run_name="__main__")


def _forget_repository_modules() -> None:
    # An environment may live inside the checkout (`make test` makes .venv there): its installed
    # modules (torch's C extensions above all) are not the repository's and must never be
    # imported twice. (sys.prefix cannot tell: under -S it is the base interpreter's.)
    for name, module in list(sys.modules.items()):
        path = os.path.abspath(getattr(module, "__file__", None) or "")
        installed = any(f"{os.sep}{folder}{os.sep}" in path
                        for folder in ("site-packages", "dist-packages"))
        if name != "__main__" and path.startswith(REPO + os.sep) and not installed:
            del sys.modules[name]


def _help(argv: list[str], base_path: list[str]) -> dict:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            _start(argv, base_path)
            code = 0
        except SystemExit as exit:
            code = _exit_code(exit)
        except BaseException:  # noqa: BLE001 -- reported as the tool's own failure would be
            traceback.print_exc()
            code = 1
    _forget_repository_modules()
    sys.path[:] = base_path
    return {"code": code, "usage": "usage:" in out.getvalue(),
            "stderr_tail": err.getvalue().strip().splitlines()[-1:]}


def main() -> None:
    commands_file, result_file = sys.argv[1:3]
    base_path = sys.path[1:]  # without this file's folder: the environment's path only
    sys.path[:] = base_path
    with open(commands_file) as handle:
        commands = json.load(handle)
    result = {"environment": _environment(),
              "tools": {name: _help(argv, base_path) for name, argv in commands.items()}}
    with open(result_file, "w") as handle:
        json.dump(result, handle)


if __name__ == "__main__":
    main()
