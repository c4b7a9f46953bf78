"""Same-schedules check: a fixed corpus of problems and a fingerprint of every schedule.

A change that must not change behaviour (a refactor, a fast path) must give the very same
schedules, not only equal critical paths. This module generates a deterministic corpus of
problems (random batches full of ties, budget stops, mixed group sizes, sequence parallelism,
pipeline and VPP counts, five cost models; and the benchmark workloads at 8-1,024 ranks) and
fingerprints each scheduler's schedule of each (the schedule's repr, hashed).

It uses only the library's public API and the benchmark workloads, so it runs against any
tree of this repository, e.g. the last release::

    git worktree add /tmp/base 09db11f
    python -m tools.scheduling.schedule_corpus --compare /tmp/base            # full corpus
    python -m tools.scheduling.schedule_corpus --record FILE --corpus suite   # fingerprints

``--compare TREE`` fingerprints the corpus in TREE (a subprocess with PYTHONPATH=TREE) and in
this tree and lists every problem whose schedule differs. The test suite checks the ``suite``
corpus against fingerprints recorded from 09db11f
(tests/unit_tests/varlen/scheduling/data/schedule_fingerprints.json).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Iterator

from megatron.varlen.scheduling import CostModel, ScheduleProblem, get_scheduler
from tools.scheduling.benchmark import WORKLOADS, make_problem, sample_batches

SCHEDULERS = ("default_dynamic_cp", "dp_balanced", "empty")
# Cost models of different shapes: the default, attention only, linear only (exact integer
# times: ties everywhere), ring traffic and latency heavy (groups grow), inter-node.
COSTS = (
    CostModel(),
    CostModel(a=1.0, b=0.0, g=0.0, d=0.0),
    CostModel(a=0.0, b=1.0, g=0.0, d=0.0),
    CostModel(a=1.0, b=192.0, g=50.0, d=6e4),
    CostModel.for_model(4096, "h100_infiniband"),
)
RANK_COUNTS = (1, 2, 3, 4, 6, 8, 12, 16, 32, 64)
BUDGETS = (64, 128, 512, 1000, 2048, 4096)
# (corpus name) -> (random problems, benchmark (ranks, sequences per rank) scales)
CORPORA = {
    "suite": (1000, ((8, 8), (64, 2), (64, 8), (1024, 2))),
    "full": (10000, ((8, 8), (8, 64), (64, 2), (64, 8), (64, 64), (256, 16), (1024, 2),
                    (1024, 64))),
}
FINGERPRINT_HEX = 16


def _lengths(rng: random.Random, count: int, longest: int) -> tuple[int, ...]:
    """Lengths of one of four shapes: uniform, a few distinct values, short, long-tailed."""
    shape = rng.choice(("uniform", "palette", "short", "tail"))
    if shape == "palette":
        palette = [rng.randint(1, longest) for _ in range(rng.choice((1, 2, 3, 6)))]
        return tuple(rng.choice(palette) for _ in range(count))
    if shape == "short":
        return tuple(rng.randint(1, max(1, longest // 16)) for _ in range(count))
    if shape == "tail":
        return tuple(min(longest, int(rng.paretovariate(1.2) * max(1, longest // 64)))
                     for _ in range(count))
    return tuple(rng.randint(1, longest) for _ in range(count))


def random_problems(count: int, seed: int = 0) -> Iterator[tuple[str, ScheduleProblem]]:
    """``count`` feasible random problems (infeasible draws are skipped)."""
    rng = random.Random(seed)
    made = 0
    while made < count:
        num_ranks = rng.choice(RANK_COUNTS)
        cp_size = rng.choice([size for size in range(1, min(num_ranks, 8) + 1)
                              if num_ranks % size == 0])
        sp_factor = rng.choice((1, 1, 1, 2))
        budget = rng.choice(BUDGETS)
        longest = max(1, budget * num_ranks - 2 * num_ranks * sp_factor)
        try:
            problem = ScheduleProblem(
                lengths=_lengths(rng, rng.randint(0, 12 * num_ranks), longest),
                dp_size=num_ranks // cp_size, cp_size=cp_size, max_seqlen_per_rank=budget,
                min_cp_size=rng.choice((1, 1, 1, 2, 4)), sp_factor=sp_factor,
                vpp_group_size=rng.choice((1, 1, 2, 4)),
                min_num_microbatches=rng.choice((1, 1, 2, 4)), cost=rng.choice(COSTS))
        except ValueError:
            continue
        yield f"random/{made}", problem
        made += 1


def benchmark_problems(scales) -> Iterator[tuple[str, ScheduleProblem]]:
    """One batch of every benchmark workload at each (ranks, sequences per rank)."""
    for ranks, per_rank in scales:
        for workload in WORKLOADS:
            (lengths,) = sample_batches(workload, ranks * per_rank, 1, seed=ranks + per_rank)
            yield (f"{workload.name}/{ranks}x{per_rank}",
                   make_problem(workload, lengths, ranks, CostModel(), pp_size=1))


def corpus(name: str) -> Iterator[tuple[str, ScheduleProblem]]:
    """The named corpus (``CORPORA``): random problems, then benchmark batches."""
    count, scales = CORPORA[name]
    yield from random_problems(count)
    yield from benchmark_problems(scales)


def fingerprint(problem: ScheduleProblem, scheduler: str) -> str:
    """A short hash of the schedule (micro-batches, CP sizes, padded lengths), or of the
    error a scheduler raises (a static CP group may not fit a sequence)."""
    try:
        schedule = get_scheduler(scheduler)(problem)
        text = repr((schedule.microbatches, schedule.cp_sizes, schedule.padded_lengths))
    except ValueError as error:
        text = f"ValueError: {error}"
    return hashlib.sha256(text.encode()).hexdigest()[:FINGERPRINT_HEX]


def fingerprints(name: str, schedulers=SCHEDULERS) -> dict[str, str]:
    """{"problem/scheduler": fingerprint} over the named corpus."""
    return {f"{key}/{scheduler}": fingerprint(problem, scheduler)
            for key, problem in corpus(name) for scheduler in schedulers}


def _in_tree(tree: Path, name: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(tree.resolve()))
    result = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--print",
                             "--corpus", name], env=env, cwd=str(tree), capture_output=True,
                            text=True, check=False)
    if result.returncode != 0:
        sys.exit(f"fingerprinting in {tree} failed:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", choices=sorted(CORPORA), default="full")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--print", action="store_true", help="fingerprints as JSON on stdout")
    action.add_argument("--record", type=Path, help="write the fingerprints to this file")
    action.add_argument("--compare", type=Path, help="another tree to compare with")
    args = parser.parse_args()
    if args.print:
        print(json.dumps(fingerprints(args.corpus)))
    elif args.record:
        args.record.write_text(json.dumps(fingerprints(args.corpus), indent=0, sort_keys=True)
                               + "\n")
    else:
        theirs, ours = _in_tree(args.compare, args.corpus), fingerprints(args.corpus)
        differ = sorted(key for key in ours if theirs.get(key) != ours[key])
        print(f"{len(ours)} schedules, {len(differ)} differ from {args.compare}")
        for key in differ[:50]:
            print(f"  {key}")
        sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
