"""Micro-batch order that shrinks pipeline bubbles (tools/scheduling/pipeline_bubbles.py
estimates the bubble with the same 1F1B simulation).

With p stages, 1F1B runs p-1 warm-up forwards before the first backward and p-1 cool-down
backwards after the last forward; while they run, other stages wait. With micro-batches of
unequal cost the wait is set by the micro-batches at the two ends, so cheap ones belong there
(verl does the same). Of a few candidate orders (as scheduled; cheap at both ends; cheapest
first then costliest first) the one whose simulated 1F1B makespan is shortest is kept: a
micro-batch of level T costs T/p per stage, forward:backward = 1:2, p2p ignored (VPP is not
simulated; its bubble is roughly this one over the number of model chunks).
"""

from __future__ import annotations

from megatron.varlen.scheduling.problem import Schedule, ScheduleProblem
from megatron.varlen.scheduling.schedule_evaluation import microbatch_levels

FORWARD_SHARE = 1.0 / 3.0  # backward is about twice the forward


def _stage_ops(stage: int, num_stages: int, num_microbatches: int) -> list[tuple[str, int]]:
    """The 1F1B op sequence of one stage: warm-up forwards, 1F1B pairs, cool-down backwards."""
    warmup = min(num_stages - stage - 1, num_microbatches)
    ops = [("F", index) for index in range(warmup)]
    for index in range(num_microbatches - warmup):
        ops.append(("F", warmup + index))
        ops.append(("B", index))
    ops.extend(("B", index) for index in range(num_microbatches - warmup, num_microbatches))
    return ops


def simulate_1f1b(levels: list[float], num_stages: int) -> float:
    """Makespan of 1F1B with per-stage op costs level/p split 1:2."""
    num = len(levels)
    ops = [_stage_ops(stage, num_stages, num) for stage in range(num_stages)]
    done: dict[tuple[str, int, int], float] = {}
    cursor, clock = [0] * num_stages, [0.0] * num_stages
    remaining = sum(len(stage_ops) for stage_ops in ops)
    while remaining:
        progressed = False
        for stage in range(num_stages):
            while cursor[stage] < len(ops[stage]):
                kind, index = ops[stage][cursor[stage]]
                ready = _dependency_done(done, kind, index, stage, num_stages)
                if ready is None:
                    break
                share = FORWARD_SHARE if kind == "F" else 1.0 - FORWARD_SHARE
                finish = max(clock[stage], ready) + levels[index] * share / num_stages
                done[(kind, index, stage)] = clock[stage] = finish
                cursor[stage] += 1
                remaining -= 1
                progressed = True
        assert progressed, "1F1B simulation deadlocked: op order inconsistent"
    return max(clock, default=0.0)


def _dependency_done(done: dict, kind: str, index: int, stage: int,
                     num_stages: int) -> float | None:
    """Finish time of the op this one waits for (0 if none), or None if not finished yet."""
    if kind == "F":
        key = ("F", index, stage - 1) if stage > 0 else None
    elif stage == num_stages - 1:
        key = ("F", index, stage)
    else:
        key = ("B", index, stage + 1)
    if key is None:
        return 0.0
    return done.get(key)


def _candidate_orders(levels: list[float]) -> list[list[int]]:
    """As scheduled; cheap at both ends (costliest in the middle); cheapest then costliest."""
    ascending = [index for _, index in sorted((level, index) for index, level in enumerate(levels))]
    front, back = ascending[0::2], ascending[1::2]
    both_ends = front + back[::-1]
    cheapest_first = ascending[:1] + ascending[1:][::-1]
    return [list(range(len(levels))), both_ends, cheapest_first]


def order_for_pipeline(schedule: Schedule, problem: ScheduleProblem, pp_size: int,
                       levels: list[float] | None = None) -> Schedule:
    """Reorders micro-batches to shorten the simulated 1F1B makespan over ``pp_size`` stages.

    Contents of micro-batches are unchanged; only their order moves, so the count stays a
    multiple of the VPP group size. With pp_size 1 the schedule is returned unchanged.
    ``levels``: the micro-batches' levels when the caller has them (else evaluated here).
    """
    if pp_size <= 1 or schedule.num_microbatches() <= 1:
        return schedule
    if levels is None:
        levels = microbatch_levels(problem, schedule)
    best_order, best_time = None, None
    for order in _candidate_orders(levels):
        makespan = simulate_1f1b([levels[index] for index in order], pp_size)
        if best_time is None or makespan < best_time:
            best_order, best_time = order, makespan
    return Schedule(microbatches=tuple(schedule.microbatches[index] for index in best_order),
                    cp_sizes=schedule.cp_sizes, padded_lengths=schedule.padded_lengths)
