"""Headline numbers of one scheduled global batch (tools/schedule_sim.py's summary)."""

from __future__ import annotations

import numpy as np

from megatron.varlen.scheduling.problem import Schedule, ScheduleProblem
from megatron.varlen.scheduling.schedule_evaluation import rank_times


def schedule_summary(problem: ScheduleProblem, schedule: Schedule) -> dict[str, float]:
    """Headline numbers of one scheduled global batch: critical path, efficiency (mean rank
    time / critical path), imbalance (max / mean rank time), packing efficiency (real tokens /
    token slots), the length sums the FLOPs use, and the length percentiles."""
    times = np.asarray(rank_times(problem, schedule), dtype=np.float64).reshape(
        len(schedule.microbatches), problem.num_ranks)
    levels = times.max(axis=1) if times.size else np.zeros(0)
    tokens = _rank_tokens(problem, schedule)
    path = float(levels.sum())
    slots = len(schedule.microbatches) * problem.num_ranks * problem.max_seqlen_per_rank
    lengths = np.asarray(problem.lengths, dtype=np.int64)
    nonempty = times[levels > 0] if times.size else times
    return {
        "num_microbatches": len(schedule.microbatches),
        "critical_path": path,
        "mean_rank_time": (float(times.sum(axis=1).mean() / problem.num_ranks)
                           if times.size else 0.0),
        "efficiency": float(times.sum() / (problem.num_ranks * path)) if path else 1.0,
        "imbalance_max_over_mean": float((nonempty.max(axis=1) / nonempty.mean(axis=1)).mean())
        if nonempty.size else 1.0,
        "idle_rank_slots": int((nonempty == 0).sum()) if nonempty.size else 0,
        "packing_efficiency": float(lengths.sum() / slots) if slots else 0.0,
        "max_rank_tokens": int(tokens.max()) if tokens.size else 0,
        "sum_lengths": int(lengths.sum()),
        "sum_squared_lengths": int((lengths * lengths).sum()),
        "p50_length": float(np.percentile(lengths, 50)) if lengths.size else 0.0,
        "p90_length": float(np.percentile(lengths, 90)) if lengths.size else 0.0,
        "p99_length": float(np.percentile(lengths, 99)) if lengths.size else 0.0,
        "max_length": int(lengths.max()) if lengths.size else 0,
    }


def _rank_tokens(problem: ScheduleProblem, schedule: Schedule) -> np.ndarray:
    """Per micro-batch, per rank padded tokens held."""
    per_seq = [padded // size for padded, size in zip(schedule.padded_lengths, schedule.cp_sizes)]
    return np.asarray([[sum(per_seq[seq] for seq in ids) for ids in ranks]
                       for ranks in schedule.microbatches], dtype=np.int64)
