"""A user script's uncaught facade error: one line, printed once, the entry points' exit code.

``pretrain_gpt.py`` reports a user error (bad flag, data, checkpoint, a non-finite loss) as
``pretrain_gpt.py: error: <message>`` on global rank 0 and exits with the error's code (2 for
bad input, 1 for a run that went wrong), on every rank, without a traceback
(``errors.exit_on_user_errors``). A facade script has no such wrapper around its own loop, so
the facade installs a ``sys.excepthook`` (at construction) that does the same for the errors
listed in :data:`SCRIPT_USER_ERRORS` that nobody caught: ``<script>: error: <message>``, once,
then the exit code. Every other exception (a bug in the script or here) goes to the hook that
was there before, traceback and all. That includes a plain ValueError raised by the user's own
code, their script or their flow (``build_samples``, ``loss``): it is their bug, not their input.
Where such a bug hits one rank of several inside a step the ranks agree on (a batch's
conversion, a start-up step), the other ranks stop with ``errors.PeerRankError``: one line
naming that rank and its exception, exit code 1. A script that catches the errors itself sees
no change (they are ValueErrors, but for a non-finite loss, an impossible packing schedule, a
bug on another rank and a missing main guard, which are RuntimeErrors).
"""

from __future__ import annotations

import atexit
import os
import sys

from megatron.varlen_training.errors import (ONE_LINE_ERRORS, USAGE_EXIT_CODE,
                                              flush_standard_streams, print_error_line)
from megatron.varlen_training.flag_errors import ArgumentValidationError
from megatron.wrap.config import ConfigError
from megatron.wrap.main_guard import MissingMainGuardError

# The errors a user acts on. ONE_LINE_ERRORS: bad data, batches and samples (UserInputError,
# megatron.wrap.flows.fields.BatchError), a checkpoint that is bad or does not match the run, a
# non-finite loss, an impossible packing schedule, another rank's bug (PeerRankError);
# ArgumentValidationError: a bad flag value in the config; ConfigError: a bad config tree or
# key; MissingMainGuardError: a script to fix.
SCRIPT_USER_ERRORS = ONE_LINE_ERRORS + (ArgumentValidationError, ConfigError,
                                        MissingMainGuardError)


def script_name() -> str:
    """The name the error line starts with, as argparse names a program: the script's file."""
    return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "megatron.wrap"


def exit_code(error: BaseException) -> int:
    """The entry points' exit code of ``error`` (2 unless its class says otherwise)."""
    return getattr(error, "exit_code", USAGE_EXIT_CODE)


class _ScriptErrorHook:
    """``sys.excepthook``: a user error as one line and its exit code; anything else to the
    hook it replaced."""

    def __init__(self, previous):
        self.previous = previous

    def __call__(self, exc_type, error, tb) -> None:
        if not isinstance(error, SCRIPT_USER_ERRORS):
            self.previous(exc_type, error, tb)
            return
        print_error_line(script_name(), error)  # global rank 0 only: every rank raised it
        # The interpreter would exit 1 after any uncaught exception: run its exit handlers
        # (the facade's print/warnings restore, megatron-core's, the user's) and leave with
        # the error's code.
        atexit._run_exitfuncs()
        flush_standard_streams()
        os._exit(exit_code(error))


def install_excepthook() -> None:
    """Makes the hook (module docstring) the outermost one; the hook it replaces handles every
    other exception. Called again after the process group starts: ``init_process_group``
    installs a hook that buffers stderr to prefix the rank, which would swallow our line."""
    if not isinstance(sys.excepthook, _ScriptErrorHook):
        sys.excepthook = _ScriptErrorHook(sys.excepthook)
