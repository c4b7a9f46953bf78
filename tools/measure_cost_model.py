#!/usr/bin/env python3
"""Measures the scheduler's cost model on this GPU and writes a hardware profile.

    python tools/measure_cost_model.py --out results/gpu/hardware_profile.json   # 184M, bf16
    python tools/measure_cost_model.py --device cpu --tiny --out /tmp/profile.json  # smoke run

The scheduler prices a sequence of length L on one rank as ``a L^2 + b L`` per layer
(megatron/varlen/scheduling/cost_model.py: the unit is one token pair's attention, a = 1,
b = 6 h by the FLOP convention). Here our GPT (pretrain_gpt.py's model, --attention-backend auto,
bf16) runs forward + backward on packs of several shapes -- the same token count split into 1 to
32 sequences, at three token counts, and mixed packs -- each timed as the median of ``--reps``
runs after warm-ups, and the times are fitted by least squares to

    t(pack) = alpha * sum(L^2) + beta * sum(L) + gamma      (gamma: per micro-batch overhead)

The profile (``--hardware-profile PATH`` of pretrain_gpt.py, tools/schedule_sim.py and
tools/benchmark_schedulers.py / ``make bench HARDWARE_PROFILE=PATH``) holds:

* ``attention_flops_per_s`` = 12 h layers / alpha: the achieved attention rate in the unit's
  FLOP convention (what the analytic profiles assume: 500 TFLOP/s for h100_nvlink);
* ``linear_to_attention_ratio`` = (beta / alpha) / h: b = ratio * h (analytic: 6);
* ``p2p_bytes_per_s`` and ``p2p_latency_s``: copied from h100_nvlink, NOT measured (one GPU has
  no CP ring; say so in any report);
* the fit itself, its points and residuals, and how far the analytic h100_nvlink model is from
  the measured times (its relative prediction error after the best common scale).
"""

from __future__ import annotations

if not __package__:  # run as `python tools/X.py`: the repository root on sys.path
    import _repo_root  # noqa: F401

import argparse
import dataclasses
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

from megatron.varlen.scheduling.cost_model import (
    ATTENTION_FLOPS_PER_PAIR_PER_HIDDEN, H100_NVLINK, CostModel,
)
from tools.benchmark_gpu import SIZES, TINY, Shape, megatron_argv, use_device

TOKEN_COUNTS = (4096, 8192, 16384)
SEQUENCES_PER_PACK = (1, 2, 4, 8, 16, 32)
TINY_TOKEN_COUNTS = (64, 128)
WARMUP_RUNS = 2
DEFAULT_REPS = 5


def pack_shapes(token_counts=TOKEN_COUNTS) -> list[list[int]]:
    """Equal splits of each token count, plus one skewed pack per count (half, quarter, ...):
    sum(L^2) varies 32-fold at a fixed sum(L), which is what separates alpha from beta."""
    shapes = []
    for total in token_counts:
        shapes += [[total // n] * n for n in SEQUENCES_PER_PACK if total // n >= 16]
        shapes.append([total // 2, total // 4, total // 8, total // 8])
    return shapes


def fit(points: list[tuple[list[int], float]]) -> dict:
    """Least-squares alpha, beta, gamma of t = alpha sum(L^2) + beta sum(L) + gamma, with R^2."""
    import numpy as np

    rows = np.array([[sum(n * n for n in pack), sum(pack), 1.0] for pack, _ in points])
    times = np.array([t for _, t in points])
    scale = rows.max(axis=0)  # columns differ by orders of magnitude: solve on [0, 1] columns
    coef, *_ = np.linalg.lstsq(rows / scale, times, rcond=None)
    alpha, beta, gamma = (coef / scale).tolist()
    predicted = rows @ (coef / scale)
    total = float(((times - times.mean()) ** 2).sum())
    r2 = 1.0 - float(((times - predicted) ** 2).sum()) / total if total > 0 else 1.0
    residuals = ((predicted - times) / times).tolist()
    return {"alpha_s_per_pair": alpha, "beta_s_per_token": beta, "gamma_s": gamma, "r2": r2,
            "max_relative_residual": max(abs(r) for r in residuals),
            "points": [{"lengths": pack if len(set(pack)) > 1 else [pack[0], len(pack)],
                        "equal_split": len(set(pack)) == 1, "seconds": t,
                        "relative_residual": r}
                       for (pack, t), r in zip(points, residuals)]}


def analytic_error(points: list[tuple[list[int], float]], cost: CostModel) -> dict:
    """How well a cost model's ``a sum(L^2) + b sum(L)`` predicts the measured times, after the
    one common scale (seconds per unit) that fits them best; and that scale."""
    predicted = [cost.a * sum(n * n for n in pack) + cost.b * sum(pack) for pack, _ in points]
    measured = [t for _, t in points]
    scale = sum(p * m for p, m in zip(predicted, measured)) / sum(p * p for p in predicted)
    errors = [(scale * p - m) / m for p, m in zip(predicted, measured)]
    return {"seconds_per_unit": scale, "max_relative_error": max(abs(e) for e in errors),
            "mean_abs_relative_error": sum(abs(e) for e in errors) / len(errors)}


def profile_document(shape: Shape, device_name: str, torch_version: str,
                     points: list[tuple[list[int], float]]) -> dict:
    """The hardware profile JSON for measured ``points`` of ``shape``."""
    result = fit(points)
    h, layers = shape.hidden_size, shape.num_layers
    alpha, beta = result["alpha_s_per_pair"], result["beta_s_per_token"]
    if alpha <= 0 or beta <= 0:
        raise ValueError(f"the fit gave alpha={alpha:.3g}, beta={beta:.3g}: not a cost model "
                         f"(too few or too noisy points; raise --reps)")
    analytic = CostModel.for_model(h, H100_NVLINK)
    measured_ratio = beta / alpha / h
    return {
        "name": "measured_" + "".join(c if c.isalnum() else "_" for c in device_name.lower()),
        "source": f"tools/measure_cost_model.py on {device_name}, torch {torch_version}, "
                  f"{datetime.date.today().isoformat()}; p2p rates copied from h100_nvlink "
                  f"(not measured: one GPU)",
        "device": device_name, "torch": torch_version,
        "date": datetime.date.today().isoformat(),
        "attention_flops_per_s": ATTENTION_FLOPS_PER_PAIR_PER_HIDDEN * h * layers / alpha,
        "linear_to_attention_ratio": measured_ratio,
        "p2p_bytes_per_s": H100_NVLINK.p2p_bytes_per_s,
        "p2p_latency_s": H100_NVLINK.p2p_latency_s,
        "p2p_measured": False,
        "micro_batch_overhead_s": result["gamma_s"],
        "model": dataclasses.asdict(shape),
        "fit": result,
        "analytic_h100_nvlink": {
            "attention_flops_per_s": H100_NVLINK.attention_flops_per_s,
            "linear_to_attention_ratio": H100_NVLINK.linear_to_attention_ratio,
            "b_over_a_measured_vs_analytic": measured_ratio / H100_NVLINK.linear_to_attention_ratio,
            **analytic_error(points, analytic),
        },
    }


# --- the measurement (needs the model; CUDA for real numbers) ----------------------------------

def _pack_step(lengths: list[int], vocab: int, pad_id: int, device, seed: int):
    import torch

    from megatron.varlen.packing.data_schedule import StepBatches
    from megatron.varlen.packing.thd_microbatch import build_model_inputs, pack_sequences

    gen = torch.Generator().manual_seed(seed)
    sequences = [{"tokens": torch.randint(0, vocab, (n,), generator=gen),
                  "labels": torch.randint(0, vocab, (n,), generator=gen),
                  "loss_mask": torch.ones(n)} for n in lengths]
    pack = pack_sequences(sequences, lengths, local_cp_size=1, pad_id=pad_id)
    inputs = build_model_inputs(pack, 0, None, device)
    return StepBatches(microbatches=[inputs], num_microbatches=1, seqlen_sum=sum(lengths),
                       seqlen_squared_sum=sum(n * n for n in lengths))


def _median_seconds(fn, reps: int, device: str) -> float:
    import torch

    for _ in range(WARMUP_RUNS):
        fn()
    times = []
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(shape: Shape, shapes: list[list[int]], reps: int, device: str) -> list:
    """[(lengths, median forward+backward seconds)] of our GPT on each pack."""
    from megatron.varlen_training.config.from_flags import parse_run_config
    from megatron.varlen_training.initialize import initialize_megatron
    from megatron.varlen_training.training import run_forward_backward, setup_model_and_optimizer

    budget = max(sum(pack) for pack in shapes)
    shape = dataclasses.replace(shape, tokens_per_micro_batch=budget,
                                seq_length=max(shape.seq_length, max(max(p) for p in shapes)))
    use_device(device)
    run = parse_run_config(megatron_argv(shape, "packed", 1, device), world_size=1)
    initialize_megatron(run)
    state = setup_model_and_optimizer(run)
    torch_device = __import__("torch").device(device)
    points = []
    for index, lengths in enumerate(shapes):
        step = _pack_step(lengths, shape.vocab_size, 0, torch_device, seed=index)
        seconds = _median_seconds(lambda: run_forward_backward(run, state, step, False), reps,
                                  device)
        points.append((lengths, seconds))
        print(f"  {len(lengths):>3} sequences, {sum(lengths):>6} tokens, "
              f"sum L^2 {sum(n * n for n in lengths):>12,}: {seconds * 1e3:8.2f} ms", flush=True)
    return points


def main(argv=None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="184m", choices=sorted(SIZES))
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a tiny model and packs (smoke runs)")
    parser.add_argument("--reps", type=int, default=DEFAULT_REPS)
    parser.add_argument("--out", type=Path, required=True, help="the profile JSON to write")
    cli = parser.parse_args(argv)
    if cli.device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device visible (use --device cpu --tiny for the smoke run)")
    if cli.reps < 1:
        parser.error(f"--reps {cli.reps} must be >= 1")
    shape = SIZES[cli.size] if not cli.tiny else dataclasses.replace(
        TINY, bf16=cli.device == "cuda")
    if cli.device != "cuda":
        shape = dataclasses.replace(shape, attention_backend="local")
    shapes = pack_shapes(TINY_TOKEN_COUNTS if cli.tiny else TOKEN_COUNTS)
    device_name = torch.cuda.get_device_name() if cli.device == "cuda" else "cpu"
    print(f"measuring {len(shapes)} packs on {device_name} ({cli.reps} reps each)", flush=True)
    points = measure(shape, shapes, cli.reps, cli.device)
    try:
        document = profile_document(shape, device_name, torch.__version__, points)
    except ValueError as error:
        print(f"measure_cost_model.py: error: {error}", file=sys.stderr)
        return 2
    cli.out.parent.mkdir(parents=True, exist_ok=True)
    cli.out.write_text(json.dumps(document, indent=2) + "\n")
    comparison = document["analytic_h100_nvlink"]
    print(f"attention {document['attention_flops_per_s'] / 1e12:.0f} TFLOP/s (analytic "
          f"{comparison['attention_flops_per_s'] / 1e12:.0f}); b/a = "
          f"{document['linear_to_attention_ratio']:.2f} h (analytic 6 h); fit R^2 "
          f"{document['fit']['r2']:.4f}, max residual "
          f"{document['fit']['max_relative_residual']:.1%};"
          f" analytic model max error {comparison['max_relative_error']:.1%}; wrote {cli.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
