"""The queue of unscheduled sequences, in packing order (longest first).

Sequences leave from the front (the next longest) and from anywhere (best fit for a hole), so
the queue is a sorted array plus a "next available position" union-find with path compression:
``first(pos)`` and ``take(pos)`` are amortised near O(1); best fit bisects ``negated_lengths``.
"""

from __future__ import annotations


class SequenceQueue:
    """Available positions of ``order`` (sequence ids sorted by length descending)."""

    def __init__(self, order: list[int], lengths: list[int],
                 negated_lengths: list[int] | None = None) -> None:
        self.order = order
        # Negated lengths ascend along the order, which bisect needs (the hole search
        # bisects it directly to skip a call). Pricing's sort gives them for free.
        if negated_lengths is None:
            negated_lengths = [-lengths[seq] for seq in order]
        self.negated_lengths = negated_lengths
        # next_available[p] == p iff position p is available; otherwise it points further right
        # (the union-find parent). Hot loops may read it directly to skip a call.
        # ``_positions`` (never changed, shared by copies) holds the very int objects an
        # available position keeps, so ``upcoming`` compares slices by identity.
        self._positions = list(range(len(order) + 1))  # len(order) is the sentinel
        self.next_available = list(self._positions)
        self.remaining = len(order)
        # Every position after this one is taken (positions are never given back): where
        # ``last`` starts its backward scan, so the scans cost O(len(order)) in all.
        self._last_hint = len(order) - 1

    def copy(self) -> "SequenceQueue":
        """An independent copy (for trying alternative micro-batches)."""
        clone = SequenceQueue.__new__(SequenceQueue)
        clone.order, clone.negated_lengths = self.order, self.negated_lengths
        clone._positions = self._positions
        clone.next_available, clone.remaining = list(self.next_available), self.remaining
        clone._last_hint = self._last_hint
        return clone

    @property
    def end(self) -> int:
        """Sentinel position returned when nothing is available."""
        return len(self.order)

    def first(self, pos: int = 0) -> int:
        """Smallest available position >= pos (``end`` if none).

        Full path compression (every position walked then points at the answer), not path
        halving: the hot loops take runs of front positions one link at a time, and packing
        copies the queue to try variants, so a chain left half-compressed would be walked
        again by every copy."""
        nxt = self.next_available
        root = pos
        while nxt[root] != root:
            root = nxt[root]
        while nxt[pos] != root:
            nxt[pos], pos = root, nxt[pos]
        return root

    def last(self) -> int:
        """Largest available position (-1 if none): the shortest queued sequence's."""
        nxt, pos = self.next_available, self._last_hint
        while pos >= 0 and nxt[pos] != pos:
            pos -= 1
        self._last_hint = pos
        return pos

    def skip_taken(self, start: int, stop: int) -> None:
        """Links every position of ``start..stop-1`` (all taken) straight to ``stop``.

        The front loops take runs of front positions without linking them one by one (a
        store per sequence); this one slice store links the run in a single hop, so the
        next ``first`` does not walk it either."""
        if stop > start:
            self.next_available[start:stop] = [stop] * (stop - start)

    def upcoming(self, pos: int, most: int) -> tuple[list[int], range | list[int]]:
        """The sequences of the next ``most`` available positions from ``pos`` (available),
        and those positions. Filled holes leave taken positions among them; usually there
        are none, and one slice comparison proves it (by identity of the int objects, see
        ``__init__``) and one slice takes them."""
        available, end = self.next_available, len(self.order)
        stop = min(pos + most, end)
        if available[pos:stop] == self._positions[pos:stop]:
            return self.order[pos:stop], range(pos, stop)
        positions: list[int] = []
        while len(positions) < most and pos < end:  # gaps: skip the taken positions
            stop = min(pos + most - len(positions), end)
            positions += [at for at in range(pos, stop) if available[at] == at]
            pos = stop
        order = self.order
        return [order[at] for at in positions], positions

    def upcoming_run(self, pos: int, most: int, min_size: list[int],
                     size: int) -> tuple[range | list[int], list[int]]:
        """``upcoming`` cut to the run of sequences whose minimum group (``min_size[seq]``)
        is ``size``, as (positions, sequences): it stops at the first that is not. Minimum
        sizes fall with the length, so once one differs every later one does too."""
        seqs, positions = self.upcoming(pos, most)
        if seqs and min_size[seqs[-1]] != size:
            cut = 0
            while min_size[seqs[cut]] == size:
                cut += 1
            seqs, positions = seqs[:cut], positions[:cut]
        return positions, seqs

    def take(self, pos: int) -> None:
        """Removes position ``pos`` (must be available)."""
        assert self.next_available[pos] == pos < len(self.order), f"position {pos} already taken"
        self.next_available[pos] = pos + 1
        self.remaining -= 1
