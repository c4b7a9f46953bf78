#!/usr/bin/env python
"""What pricing a sliding window's layers exactly buys the scheduler: side by side, in one run.

The same global batches are scheduled twice by ``--scheduler``: once with every attention layer
priced as full causal attention (a*P^2: how the cost model priced a windowed model before), once
with the windowed layers on their real squared tokens (a_window * m*(2P - m), cost_model.py).
Both schedules are then judged under the exact windowed price: the critical path each one
really has. Cost-model units on CPU (no GPU time); the ratio is the claim.

Example (gpt-oss-like: hidden 2880, half the layers on a 128-key window, long RL rollouts):
    python tools/window_pricing_balance.py --hidden-size 2880 --window 127 --windowed-share 0.5
"""

from __future__ import annotations

if not __package__:  # run as `python tools/X.py`: the repository root on sys.path
    import _repo_root  # noqa: F401

import argparse
import dataclasses

from megatron.varlen.packing.length_distributions import parse_length_config
from megatron.varlen.scheduling.cost_model import CostModel
from megatron.varlen.scheduling.registry import get_scheduler, scheduler_names
from megatron.varlen.scheduling.schedule_evaluation import critical_path
from tools.scheduling.simulate import SimConfig, build_problem, split_batches

# Long-tailed RL rollouts (most short, a few at 64k), as the product's users run them.
DEFAULT_DISTRIBUTION = ('{"mode":"distribution","type":"lognormal","min_seq_len":256,'
                        '"max_seq_len":65536,"mean_seq_len":8192,"lognormal_sigma":1.2}')


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden-size", type=int, default=2880)
    parser.add_argument("--window", type=int, default=127,
                        help="--window-size's LEFT (earlier keys a query sees)")
    parser.add_argument("--windowed-share", type=float, default=0.5,
                        help="share of the attention layers that are windowed, in (0, 1]")
    parser.add_argument("--distribution", default=DEFAULT_DISTRIBUTION,
                        help="lengths: the --sft-mock-dataset-config-json schema")
    parser.add_argument("--dp-size", type=int, default=16)
    parser.add_argument("--cp-size", type=int, default=4)
    parser.add_argument("--max-seqlen-per-dp-cp-rank", type=int, default=8192)
    parser.add_argument("--global-batch-size", type=int, default=256)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--scheduler", default="default_dynamic_cp", choices=scheduler_names())
    parser.add_argument("--seed", type=int, default=0)
    return parser


def priced_paths(args: argparse.Namespace) -> dict[str, float]:
    """{pricing: total critical path under the exact windowed price} over the batches."""
    if not 0.0 < args.windowed_share <= 1.0:
        raise ValueError(f"--windowed-share {args.windowed_share} must be in (0, 1]")
    full = CostModel.for_model(args.hidden_size)
    exact = dataclasses.replace(full, a=full.a * (1.0 - args.windowed_share),
                                a_window=full.a * args.windowed_share, window=args.window)
    lengths = parse_length_config(args.distribution, seq_length=2).sample(
        args.batches * args.global_batch_size, args.seed).tolist()
    paths = {}
    for label, cost in (("all-quadratic", full), ("windowed", exact)):
        config = SimConfig(dp_size=args.dp_size, cp_size=args.cp_size,
                           max_seqlen_per_rank=args.max_seqlen_per_dp_cp_rank,
                           global_batch_size=args.global_batch_size,
                           max_seq_len=max(lengths), scheduler=args.scheduler, cost=cost)
        total = 0.0
        for batch in split_batches(lengths, config, args.batches):
            problem = build_problem(batch, config)
            schedule = get_scheduler(args.scheduler)(problem)
            total += critical_path(dataclasses.replace(problem, cost=exact), schedule)
        paths[label] = total
    return paths


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        paths = priced_paths(args)
    except ValueError as err:
        print(f"error: {err}")
        return 2
    for label, path in paths.items():
        print(f"planned with the {label:13s} price: critical path {path:.4e} (exact price)")
    print(f"windowed / all-quadratic: {paths['windowed'] / paths['all-quadratic']:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
