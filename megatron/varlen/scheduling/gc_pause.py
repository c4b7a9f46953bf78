"""Pause Python's cyclic garbage collector while a scheduler runs.

Scheduling a large batch allocates a few hundred thousand small lists and tuples and frees
none of them until it returns; each allocation burst triggers collections that walk every
young object (and periodically all live ones) without ever finding a cycle. Pausing the
collector removes that cost (about 10% at 65,536 sequences); reference counting still frees
everything, and the previous collector state is restored even on error.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Disables the cyclic collector inside the block, restoring its previous state."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
