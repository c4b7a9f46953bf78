#!/usr/bin/env python
"""Run a sequence-packing scheduler offline and print the raw schedule.

Examples:
    python tools/schedule_sim.py --lengths-file lengths.txt --dp-size 4 --cp-size 2 \\
        --max-seqlen-per-dp-cp-rank 4096 --global-batch-size 64 --json
    python tools/schedule_sim.py --distribution '{"mode":"distribution","type":"lognormal",
        "min_seq_len":128,"max_seq_len":8192,"mean_seq_len":1024,"lognormal_sigma":1.5}' \\
        --dp-size 16 --cp-size 4 --max-seqlen-per-dp-cp-rank 2048 --global-batch-size 4096

With --json, stdout holds only the JSON document described in docs/SCHEDULING.md; ids in
"microbatches" index the batch's "lengths", ranks are the DPxCP ranks in order.
"""

from __future__ import annotations

if not __package__:  # run as `python tools/X.py`: the repository root on sys.path
    import _repo_root  # noqa: F401

import argparse
import json
import os
import sys

from megatron.varlen.packing.length_distributions import (
    parse_length_config,
    read_lengths_file,
)
from megatron.varlen.scheduling.cost_model import DEFAULT_HIDDEN_SIZE, PROFILES, CostModel
from megatron.varlen.scheduling.registry import scheduler_names
from tools.scheduling.simulate import (
    REFERENCE_SCHEDULERS,
    SimConfig,
    simulate,
)

DEFAULT_NUM_BATCHES_FOR_DISTRIBUTIONS = 4


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--lengths-file", help="one integer length per line, optional header")
    source.add_argument("--distribution", help="inline JSON or a path, same schema as "
                        "--sft-mock-dataset-config-json")
    parser.add_argument("--dp-size", type=int, required=True)
    parser.add_argument("--cp-size", type=int, default=1)
    parser.add_argument("--max-seqlen-per-dp-cp-rank", type=int, required=True)
    parser.add_argument("--min-dynamic-context-parallel-size", type=int, default=1)
    parser.add_argument("--scheduler", default="default_dynamic_cp",
                        choices=sorted(set(scheduler_names()) | set(REFERENCE_SCHEDULERS)))
    parser.add_argument("--global-batch-size", type=int, required=True)
    parser.add_argument("--max-seq-len", type=int, default=None,
                        help="clip lengths to this (default: no clipping)")
    parser.add_argument("--hidden-size", type=int, default=DEFAULT_HIDDEN_SIZE)
    parser.add_argument("--hardware-profile", default="h100_nvlink", metavar="NAME|PATH",
                        help=f"{', '.join(sorted(PROFILES))}, or a JSON profile written by "
                             f"tools/measure_cost_model.py")
    for name in "abgd":
        parser.add_argument(f"--cost-{name}", type=float, default=None,
                            help=f"override cost coefficient {name}")
    parser.add_argument("--vpp-microbatch-group-size", type=int, default=1)
    parser.add_argument("--pipeline-model-parallel-size", type=int, default=1,
                        help="minimum micro-batch count; also orders micro-batches for 1F1B")
    parser.add_argument("--sp-factor", type=int, default=1,
                        help="TP size when sequence parallelism is on, else 1")
    parser.add_argument("--num-global-batches", type=int, default=None,
                        help=f"cap on batches (distributions default to "
                             f"{DEFAULT_NUM_BATCHES_FOR_DISTRIBUTIONS})")
    parser.add_argument("--seed", type=int, default=0, help="seed for distributions")
    parser.add_argument("--no-bounds", action="store_true", help="skip the lower bounds")
    parser.add_argument("--json", action="store_true", help="print only the JSON document")
    return parser


def load_lengths(args: argparse.Namespace) -> list[int]:
    """Lengths from the file, or sampled from the distribution."""
    if args.lengths_file:
        if not os.path.isfile(args.lengths_file):
            raise ValueError(f"lengths file {args.lengths_file!r} does not exist "
                             "(check --lengths-file)")
        return read_lengths_file(args.lengths_file)
    config = parse_length_config(args.distribution, seq_length=2)
    num_batches = args.num_global_batches or DEFAULT_NUM_BATCHES_FOR_DISTRIBUTIONS
    return config.sample(num_batches * args.global_batch_size, args.seed).tolist()


def build_config(args: argparse.Namespace, lengths: list[int]) -> SimConfig:
    cost = CostModel.for_model(args.hidden_size, args.hardware_profile, a=args.cost_a,
                               b=args.cost_b, g=args.cost_g, d=args.cost_d)
    return SimConfig(
        dp_size=args.dp_size, cp_size=args.cp_size,
        max_seqlen_per_rank=args.max_seqlen_per_dp_cp_rank,
        global_batch_size=args.global_batch_size,
        max_seq_len=args.max_seq_len or max(lengths, default=1),
        scheduler=args.scheduler, min_cp_size=args.min_dynamic_context_parallel_size,
        sp_factor=args.sp_factor, pp_size=args.pipeline_model_parallel_size,
        vpp_group_size=args.vpp_microbatch_group_size, cost=cost)


def _ratio(path: float, bound: float | None) -> str:
    return f"{path / bound:8.3f}" if bound else f"{'-':>8}"


def print_table(result: dict) -> None:
    """Readable per-batch summary."""
    print(f"scheduler {result['scheduler']}  DP {result['dp_size']} x CP {result['cp_size']}  "
          f"budget {result['max_seqlen_per_dp_cp_rank']} tokens/rank  cost {result['cost']}")
    header = f"{'batch':>5} {'seqs':>6} {'mbs':>4} {'critical path':>14} {'/simple':>8} " \
             f"{'/budget':>8} {'/latency':>8} {'effic.':>7} {'idle':>5} {'ms':>8}"
    print(header)
    for index, record in enumerate(result["global_batches"]):
        summary = record["summary"]
        simple = record.get("simple_bound")
        budget = record.get("budget_aware_bound")
        latency = record.get("latency_aware_bound")
        path = record["critical_path"]
        print(f"{index:>5} {len(record['lengths']):>6} {summary['num_microbatches']:>4} "
              f"{path:>14.4e} {_ratio(path, simple)} {_ratio(path, budget)} "
              f"{_ratio(path, latency)} "
              f"{summary['efficiency']:>7.3f} {summary['idle_rank_slots']:>5} "
              f"{record['scheduler_ms']:>8.2f}")
    print("totals:", json.dumps(result["summary"], sort_keys=True))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        lengths = load_lengths(args)
        result = simulate(lengths, build_config(args, lengths), args.num_global_batches,
                          with_bounds=not args.no_bounds)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.json:
        json.dump(result, sys.stdout)
        sys.stdout.write("\n")
    else:
        print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
