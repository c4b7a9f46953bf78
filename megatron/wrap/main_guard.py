"""Scripts without ``if __name__ == "__main__":`` must not hang in ``save()``.

megatron-core's checkpoint writer (``dist_checkpointing``'s ``FileSystemWriterAsync``, used by
every ``torch_dist`` save) collects its writers' results through a
``multiprocessing.get_context("spawn").Manager().Queue()``, created at the first save. A
*spawn* child starts a fresh interpreter that re-imports the parent's ``__main__`` file; a
script without a main guard then runs again in it (new ``MegatronWrap``, ``initialize()``,
which waits for a process group that never forms), and the parent waits for the child for ever.

For such a script the facade creates that queue up front from a *fork* context (the child is a
copy of the process and runs no script; megatron-core forks its writer processes the same way),
so ``save()`` works. If megatron-core no longer keeps the queue where this module expects it,
``initialize()`` fails at once in one line asking for the guard instead.
"""

from __future__ import annotations

import ast
import multiprocessing
import sys
from pathlib import Path

from megatron.varlen_training import log

MAIN_NAMES = ("__main__",)
GUARD_HINT = 'put the script\'s top-level code under `if __name__ == "__main__":`'


class MissingMainGuardError(RuntimeError):
    """A script without a main guard and no way to keep megatron-core from re-running it."""


def has_main_guard(source: str) -> bool:
    """Whether a module's top level holds ``if __name__ == "__main__":`` (either order)."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and _is_main_test(node.test):
            return True
    return False


def _is_main_test(test: ast.expr) -> bool:
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1
            and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s.id for s in sides if isinstance(s, ast.Name)]
    texts = [s.value for s in sides if isinstance(s, ast.Constant)]
    return names == ["__name__"] and texts == ["__main__"]


def unguarded_main_script() -> Path | None:
    """The ``__main__`` file if it is a script without a main guard (a spawn child would
    re-run it), else None (guarded, ``python -c``, an interactive session, unreadable)."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if path is None or not Path(path).is_file():
        return None
    try:
        guarded = has_main_guard(Path(path).read_text())
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    return None if guarded else Path(path)


def protect_unguarded_script() -> None:
    """For a script without a main guard: megatron-core's checkpoint-writer queue from a fork
    context (module docstring); nothing otherwise.

    Raises:
        MissingMainGuardError: megatron-core keeps no such queue any more (one line).
    """
    script = unguarded_main_script()
    if script is None:
        return
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if not hasattr(filesystem_async, "_results_queue"):  # the module's cache of that queue
        raise MissingMainGuardError(
            f"{script} has no main guard and this megatron-core's checkpoint writer starts a "
            f"'spawn' process that would re-run it (save() would hang): {GUARD_HINT}")
    if filesystem_async._results_queue is None:
        filesystem_async._results_queue = multiprocessing.get_context("fork").Manager().Queue()
    log.debug_rank_0("%s has no main guard: megatron-core's checkpoint writer queue was made with "
                     "'fork' (a 'spawn' helper would re-run the script)", script)
