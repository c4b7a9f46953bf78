"""Puts the repository root on ``sys.path`` for a tool run as ``python tools/X.py``.

Python starts a script with the script's folder (``tools/``) first on ``sys.path``, not the
folder it was started from, so ``tools.*`` (the code the tools share) and ``tests.harness`` (the
multi-rank harness ``benchmark_training.py`` uses) import only where something else put the
repository root on the path: the dev venv's ``.pth`` file (scripts/setup_env.sh), ``PYTHONPATH``
or pytest. A user who ran ``pip install -e .`` in their own environment has none of them. Every
script in ``tools/`` therefore starts with::

    if not __package__:  # run as `python tools/X.py`: the repository root on sys.path
        import _repo_root  # noqa: F401

which finds this module next to the script. Imported as part of the ``tools`` package (by
tests, by other tools, or run as ``python -m tools.X`` from the root) a script skips it: the
root is importable then. Moving the shared code into the installed package instead would ship
benchmark, bound and test-harness code that the library never uses; one module and two lines
per script is the least machinery that keeps ``tools/`` and ``tests/`` out of the package.
"""

import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)
