"""The queue of unscheduled sequences, in packing order (longest first).

Sequences leave from the front (the next longest) and from anywhere (best fit for a hole), so
the queue is a sorted array plus a "next available position" union-find with path compression:
``first(pos)`` and ``take(pos)`` are amortised near O(1), and ``longest_at_most`` bisects the
sorted lengths.
"""

from __future__ import annotations

from bisect import bisect_left


class SequenceQueue:
    """Available positions of ``order`` (sequence ids sorted by length descending)."""

    def __init__(self, order: list[int], lengths: list[int]) -> None:
        self.order = order
        # Negated, the lengths ascend along the order, as bisect needs.
        self._negated_lengths = [-lengths[seq] for seq in order]
        # _next[p] == p iff position p is available; otherwise it points further right (the
        # union-find parent). len(order) is the sentinel, always available.
        self._next = list(range(len(order) + 1))
        self.remaining = len(order)
        # Every position after this one is taken (positions are never given back): where
        # ``last`` starts its backward scan, so its scans cost O(len(order)) in all.
        self._last_hint = len(order) - 1

    def copy(self) -> "SequenceQueue":
        """An independent copy (for trying alternative micro-batches)."""
        clone = SequenceQueue.__new__(SequenceQueue)
        clone.order, clone._negated_lengths = self.order, self._negated_lengths
        clone._next, clone.remaining = list(self._next), self.remaining
        clone._last_hint = self._last_hint
        return clone

    @property
    def end(self) -> int:
        """Sentinel position returned when nothing is available."""
        return len(self.order)

    def first(self, pos: int = 0) -> int:
        """Smallest available position >= pos (``end`` if none). Full path compression: packing
        copies the queue to try variants, and every copy would walk a chain left uncompressed."""
        nxt = self._next
        root = pos
        while nxt[root] != root:
            root = nxt[root]
        while nxt[pos] != root:
            nxt[pos], pos = root, nxt[pos]
        return root

    def last(self) -> int:
        """Largest available position (-1 if none): the shortest queued sequence's."""
        pos = self._last_hint
        while pos >= 0 and self._next[pos] != pos:
            pos -= 1
        self._last_hint = pos
        return pos

    def longest_at_most(self, length: int) -> int:
        """First available position whose sequence is at most ``length`` long (``end`` if
        none): the longest queued sequence that short."""
        return self.first(bisect_left(self._negated_lengths, -length))

    def take(self, pos: int) -> None:
        """Removes position ``pos`` (must be available)."""
        assert self._next[pos] == pos < len(self.order), f"position {pos} already taken"
        self._next[pos] = pos + 1
        self.remaining -= 1
