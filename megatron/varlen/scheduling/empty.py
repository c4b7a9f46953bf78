"""``empty``: the sampler already chose each sequence's DP rank; only pack into micro-batches.

Each DP rank's sequences (``problem.owners``; a contiguous split when None) are packed in id
order by next-fit under the per-rank token budget on that DP rank's static CP group. The packed
bins of all DP ranks are then laid out round-robin over the micro-batches (owner o's bins start
where owner o-1's ended) so no micro-batch is empty while bins remain; bins are halved when the
pipeline or the VPP multiple needs more micro-batches than there are bins.
"""

from __future__ import annotations

from megatron.varlen.scheduling.counts import target_microbatch_count
from megatron.varlen.scheduling.dp_balanced import STATIC_FLAG_HINT
from megatron.varlen.scheduling.pricing import padded_lengths_array, price_items
from megatron.varlen.scheduling.problem import Schedule, ScheduleProblem


def contiguous_owners(num_sequences: int, dp_size: int) -> tuple[int, ...]:
    """Owner of each sequence when the sampler split the batch into contiguous DP slices."""
    return tuple(seq * dp_size // num_sequences for seq in range(num_sequences))


def _next_fit(seqs: list[int], tokens: list[int], budget: int) -> list[list[int]]:
    """Packs ``seqs`` in order, opening a new bin when the next one does not fit."""
    bins: list[list[int]] = []
    used = budget + 1  # forces a first bin
    for seq in seqs:
        if used + tokens[seq] > budget:
            bins.append([])
            used = 0
        bins[-1].append(seq)
        used += tokens[seq]
    return bins


def _split_one_bin(bins_by_owner: list[list[list[int]]], limit: int) -> bool:
    """Halves the fullest bin of an owner with fewer than ``limit`` bins; False if none."""
    best = None
    for owner, bins in enumerate(bins_by_owner):
        if len(bins) >= limit:
            continue
        for index, members in enumerate(bins):
            if len(members) >= 2 and (best is None or len(members) > best[0]):
                best = (len(members), owner, index)
    if best is None:
        return False
    _, owner, index = best
    members = bins_by_owner[owner][index]
    half = len(members) // 2
    bins_by_owner[owner][index:index + 1] = [members[:half], members[half:]]
    return True


def _balance_bin_count(bins_by_owner: list[list[list[int]]], problem: ScheduleProblem) -> int:
    """Splits bins until the target micro-batch count is reachable; returns that count."""
    num_sequences = problem.num_sequences
    while True:
        target = target_microbatch_count(max(map(len, bins_by_owner)), num_sequences,
                                         problem.min_num_microbatches, problem.vpp_group_size)
        if sum(map(len, bins_by_owner)) >= target or not _split_one_bin(bins_by_owner, target):
            return target


def empty(problem: ScheduleProblem) -> Schedule:
    """Packs each DP rank's own sequences into micro-batches on its static CP group."""
    pricing = price_items(problem, (problem.cp_size,), STATIC_FLAG_HINT)
    owners = problem.owners or contiguous_owners(problem.num_sequences, problem.dp_size)
    seqs_by_owner: list[list[int]] = [[] for _ in range(problem.dp_size)]
    for seq, owner in enumerate(owners):
        seqs_by_owner[owner].append(seq)
    bins_by_owner = [_next_fit(seqs, pricing.min_tokens, problem.max_seqlen_per_rank)
                     for seqs in seqs_by_owner]
    count = _balance_bin_count(bins_by_owner, problem)
    layout: list[list[tuple[int, ...]]] = [[() for _ in range(problem.num_ranks)]
                                           for _ in range(count)]
    cp = problem.cp_size
    slot = 0
    for owner, bins in enumerate(bins_by_owner):
        for members in bins:
            layout[slot % count][owner * cp:(owner + 1) * cp] = [tuple(members)] * cp
            slot += 1
    padded = padded_lengths_array(problem.lengths, cp, problem.sp_factor)
    return Schedule(microbatches=tuple(tuple(ranks) for ranks in layout),
                    cp_sizes=(cp,) * problem.num_sequences, padded_lengths=tuple(padded.tolist()))
