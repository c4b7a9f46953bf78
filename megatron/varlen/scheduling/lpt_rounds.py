"""LPT onto many equal-size blocks in numpy rounds: the same placements as one heap step per
sequence (and as packing._lpt_sorted_rounds, the Python rounds below that size), for
micro-batches of packing.LPT_ROUNDS_MIN_BLOCKS blocks or more (1,024 ranks), where LPT is
the largest single cost.

Sequences come longest first, so their times never grow. Sort the blocks by (time, index),
the heap's order, and give the next k sequences to the k least-loaded blocks in that order:
sequence j goes where the heap would put it as long as that block still comes before every
block already raised in this round, i.e. (time_j, block_j) < (time_i + x_i, block_i) for all
i < j. The round stops at the first j where that fails (a tie counts as a failure: the next
round re-sorts and settles it by index, as the heap does), at the first sequence whose
minimum group is another size, or at the first whose block has no token room (where the
heap loop stops too). A round gathers no more sequences than there are blocks below the
least-loaded block raised by its first sequence (no later one can go further). Float sums are the same additions as the heap loop's, so the result is
bit-identical; a test compares both on many batches.
"""

from __future__ import annotations

import numpy as np

from megatron.varlen.scheduling.draft import MicrobatchDraft
from megatron.varlen.scheduling.pricing import ItemPricing
from megatron.varlen.scheduling.seq_queue import SequenceQueue

# When a round places fewer sequences than this, numpy's per-round overhead costs more than
# the heap steps it replaces: the caller's heap loop finishes the micro-batch instead.
MIN_ROUND = 48


def _round_length(loads: np.ndarray, raised: np.ndarray, tokens_after: np.ndarray,
                  budget: int) -> tuple[int, bool]:
    """(sequences the heap would place exactly as this round does, whether it then stops on
    the token budget)."""
    # Sequence j (>= 1) keeps its block while that block's load is strictly below every
    # block raised before it in the round (a tie is settled by index in the next round).
    keeps = loads[1:] < np.minimum.accumulate(raised)[:-1]
    stop = len(raised) if keeps.all() else int(np.argmin(keeps)) + 1
    over = tokens_after[:stop] > budget
    if over.any():
        return int(np.argmax(over)), True
    return stop, False


def _prices(array: np.ndarray | None, values: list, seqs: list[int]) -> np.ndarray:
    """``values[seq]`` for each of ``seqs`` as an array: a numpy gather from pricing's array
    when it has one (no Python step per sequence), else from the list."""
    if array is not None:
        return array[np.asarray(seqs)]
    return np.asarray([values[seq] for seq in seqs])


def lpt_in_rounds(draft: MicrobatchDraft, pricing: ItemPricing, queue: SequenceQueue,
                  heap: list, size: int, pos: int,
                  absorbed: float) -> tuple[int, bool, float, int]:
    """Places sequences from ``pos`` as the heap loop would. ``heap`` must hold every block of
    the draft (all of size ``size``); it gets every block's (time, block) back, in block
    order (not heapified). ``absorbed`` is the caller's
    running sum of the placed sequences' minimum work (continued here in the same order, so
    the total is the heap loop's to the bit).

    Returns:
        (position reached, finished, absorbed, sequences taken): finished means placement
        stopped as the heap loop's would (token budget, another size, the queue's end);
        otherwise a round placed fewer than MIN_ROUND and the heap loop should go on.
    """
    times, tokens, members = draft.times, draft.tokens, draft.members
    min_time, min_tokens, min_work = pricing.min_time, pricing.min_tokens, pricing.min_work
    order, min_size, budget = pricing.order, pricing.min_size, pricing.budget
    # The blocks' loads and tokens live in arrays for the whole call (written back once at
    # the end): a round only changes the blocks it raises.
    loads, block_tokens = np.asarray(times), np.asarray(tokens)
    index = np.arange(len(times))
    finished, taken = False, 0
    while True:
        if pos >= queue.end or min_size[order[pos]] != size:
            finished = True
            break
        by_load = np.lexsort((index, loads))
        first = int(by_load[0])
        if int(block_tokens[first]) + min_tokens[order[pos]] > budget:
            finished = True  # the heap loop stops here too
            break
        # Only blocks below the least-loaded one raised by the next sequence can take a
        # sequence of this round: gather no more sequences than that.
        count = max(1, int(np.searchsorted(loads[by_load],
                                           float(loads[first]) + min_time[order[pos]])))
        positions, seqs = queue.upcoming_run(pos, count, min_size, size)
        by_load = by_load[:len(seqs)]
        chosen_loads = loads[by_load]
        raised = chosen_loads + _prices(pricing.min_time_array, min_time, seqs)
        tokens_after = block_tokens[by_load] + _prices(pricing.min_tokens_array, min_tokens,
                                                       seqs)
        placed, on_budget = _round_length(chosen_loads, raised, tokens_after, budget)
        loads[by_load[:placed]] = raised[:placed]
        block_tokens[by_load[:placed]] = tokens_after[:placed]
        for block, seq in zip(by_load[:placed].tolist(), seqs):
            members[block].append(seq)
            absorbed += min_work[seq]
        taken += placed
        pos = positions[placed] if placed < len(positions) else queue.first(positions[-1] + 1)
        if on_budget:
            finished = True
            break
        if placed < MIN_ROUND:
            break
    times[:] = loads.tolist()
    tokens[:] = block_tokens.tolist()
    heap[:] = zip(times, range(len(times)))  # block order; the caller heapifies if it needs
    return pos, finished, absorbed, taken
