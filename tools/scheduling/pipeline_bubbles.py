"""A 1F1B bubble estimate of one global batch's micro-batch levels (the benchmark's pipeline
study and tools/schedule_sim.py), on the library's 1F1B simulation (pipeline_order.py)."""

from __future__ import annotations

from dataclasses import dataclass

from megatron.varlen.scheduling.pipeline_order import simulate_1f1b


@dataclass(frozen=True)
class BubbleEstimate:
    """Result of simulating one global batch through a 1F1B pipeline.

    Attributes:
        makespan: Simulated time of the step.
        ideal: Busy time of one stage (sum of levels / p): the makespan without bubbles.
        bubble_fraction: (makespan - ideal) / makespan.
        uniform_fraction: (p-1)/(m+p-1), the textbook bubble for equal micro-batches.
    """

    makespan: float
    ideal: float
    bubble_fraction: float
    uniform_fraction: float


def pipeline_bubble_estimate(levels: list[float], pp_size: int) -> BubbleEstimate:
    """Simulates one global batch with micro-batch ``levels`` through ``pp_size`` stages."""
    if pp_size < 1:
        raise ValueError(f"pp_size={pp_size} must be >= 1 (check --pipeline-model-parallel-size)")
    num = len(levels)
    ideal = sum(levels) / pp_size
    makespan = simulate_1f1b(list(levels), pp_size) if num else 0.0
    bubble = (makespan - ideal) / makespan if makespan > 0 else 0.0
    uniform = (pp_size - 1) / (num + pp_size - 1) if num else 0.0
    return BubbleEstimate(makespan=makespan, ideal=ideal, bubble_fraction=bubble,
                          uniform_fraction=uniform)
