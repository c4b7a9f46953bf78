"""Blocks by load, least first: the priority queue of LPT (longest processing time first).

Packing gives each sequence, longest first, to the least-loaded block (front.py) and fills the
least-loaded hole first (holes.py): both take the least (time, block) and put it back raised,
and a raised block mostly moves behind all others. So entries are kept in *sorted rounds*: a
sorted list read from the front, and this round's raised entries aside with their least
tracked; only when a raised one comes below the next unread one are both merged by one sort.
Mostly one comparison per placement instead of a heap's dozen. Entries are unique (one per
block), so the least is the heap's least: ties go to the lower block.
"""

from __future__ import annotations

import math
from typing import Iterable

Entry = tuple[float, int]  # (per-rank time, block)
# After every entry: what an exhausted run reads as.
_PAST_ALL: Entry = (math.inf, math.inf)


class LeastLoaded:
    """(time, block) entries; ``least`` peeks at the least, ``pop_least`` removes it and
    ``push`` adds an entry (a raised block)."""

    def __init__(self, entries: Iterable[Entry]) -> None:
        self._sorted = sorted(entries)
        self._read = 0  # entries before this index of _sorted have been popped
        self._raised: list[Entry] = []
        self._least_raised = _PAST_ALL

    def __len__(self) -> int:
        return len(self._sorted) - self._read + len(self._raised)

    def least(self) -> Entry:
        """The least entry (``(inf, inf)`` when empty)."""
        unread = self._sorted[self._read] if self._read < len(self._sorted) else _PAST_ALL
        if self._least_raised < unread:
            self._sorted = sorted(self._sorted[self._read:] + self._raised)
            self._read, self._raised, self._least_raised = 0, [], _PAST_ALL
            unread = self._sorted[0]
        return unread

    def pop_least(self) -> Entry:
        """Removes and returns the least entry (the queue must not be empty)."""
        entry = self.least()
        self._read += 1
        return entry

    def push(self, entry: Entry) -> None:
        """Adds ``entry``; its block must not have an entry already."""
        self._raised.append(entry)
        if entry < self._least_raised:
            self._least_raised = entry
