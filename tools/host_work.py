#!/usr/bin/env python3
"""Where one training step's host work goes: ATen operator calls by phase and call site, on CPU.

    python tools/host_work.py                                   # packs of 4 vs 64 sequences
    python tools/host_work.py --sequences 4,64 --tokens 512 --configs packed,padded --top 30
    python tools/host_work.py --json /tmp/host_work.json        # the tables, for a diff
    python tools/host_work.py --extra-args "--num-experts 4 --moe-router-topk 2"   # MoE

Each configuration trains our GPT (tiny by default, ``--attention-backend flash``: on CPU its
kernel twin, counted as ONE call, which is what the CUDA kernel is) for ``--warmup`` steps, then
one step under :class:`~megatron.varlen.platform.host_syncs.DispatchCounts`: every ATen
operator call, by phase (``data``: the step's micro-batches built from its samples (gather,
schedule, pack, move); ``forward``: megatron-core's forward_step with our model and loss;
``backward``: its backward_step; ``step``: the rest of train_step, i.e. loss report, gradient
finalisation, grad norm, clipping and Adam) and by site (the Python ``file:line`` outside
torch; in backward the autograd node). ``packed-N`` packs N sequences of ``--tokens``/N tokens
each into one micro-batch; ``padded-N`` is the unpacked path ([N, tokens/N] rows). The
printed growth table lists the sites whose count changes between the fewest and the most
sequences per pack with the same tokens: host work that grows with the number of sequences
(a defect unless it is the kernel's or RoPE's). Last, the CPU wall time per step (median of
``--timed`` steps; tiny model: host time dominates, as at 184M on an H200).

These are CPU counts: operator calls, not GPU kernels or GPU time.
"""

from __future__ import annotations

if not __package__:  # run as `python tools/X.py`: the repository root on sys.path
    import _repo_root  # noqa: F401

import argparse
import collections
import contextlib
import functools
import json
import os
import shlex
import statistics
import sys
import tempfile
import time

import torch

PHASES = ("data", "forward", "backward", "step")
KERNEL_OP = "varlen_attn (one kernel call)"
KERNEL_BACKWARD_OP = "varlen_attn backward (one kernel call)"
DEFAULT_SEQUENCES = "4,64"
DEFAULT_TOKENS = 512
VOCAB = 256


def model_argv(config: str, num_sequences: int, tokens: int, lengths_file: str, iters: int,
               layers: int, hidden: int, heads: int, extra: tuple[str, ...] = ()) -> list[str]:
    """Our flags for ``config`` ("packed" or "padded") on ``num_sequences`` samples of
    ``tokens // num_sequences`` tokens, one micro-batch per step."""
    length = tokens // num_sequences
    argv = [
        "--num-layers", str(layers), "--hidden-size", str(hidden),
        "--num-attention-heads", str(heads), "--seq-length", str(length),
        "--max-position-embeddings", str(length), "--global-batch-size", str(num_sequences),
        "--train-iters", str(iters), "--lr", "1e-4", "--clip-grad", "1.0", "--mock-data",
        "--sft", "--sft-mock-dataset-config-json",
        json.dumps({"mode": "file", "path": lengths_file}), "--tokenizer-type", "NullTokenizer",
        "--vocab-size", str(VOCAB), "--make-vocab-size-divisible-by", "128",
        "--position-embedding-type", "rope", "--disable-bias-linear", "--hidden-dropout", "0",
        "--attention-dropout", "0", "--seed", "1234", "--log-interval", "1000000",
        "--eval-iters", "0", "--calculate-per-token-loss", "--attention-backend", "flash",
        *extra,
    ]
    if config == "packed":
        return argv + ["--micro-batch-size", "1", "--sequence-packing",
                       "--max-seqlen-per-dp-cp-rank", str(tokens)]
    if config == "padded":
        return argv + ["--micro-batch-size", str(num_sequences)]
    raise ValueError(f"unknown configuration {config!r}: packed or padded")


class _OneKernelCall(torch.autograd.Function):
    """The kernel's CPU twin as one autograd node, its operators not counted: on CUDA the
    forward and the backward are one kernel call each."""

    @staticmethod
    def forward(ctx, counts, kernel, args, query, key, value):
        ctx.counts, ctx.kernel, ctx.args = counts, kernel, args
        ctx.save_for_backward(query, key, value)
        with counts.paused():
            return kernel(query, key, value, *args)

    @staticmethod
    def backward(ctx, grad_out):
        ctx.counts.add(KERNEL_BACKWARD_OP)
        with ctx.counts.paused(), torch.enable_grad():
            inputs = [t.detach().requires_grad_() for t in ctx.saved_tensors]
            out = ctx.kernel(*inputs, *ctx.args)
            grads = torch.autograd.grad(out, inputs, grad_out)
        return (None, None, None, *grads)


@contextlib.contextmanager
def _phases(counts):
    """Counts megatron-core's forward_step / backward_step under their phases and the flash
    kernel's CPU twin as one call (patched for the block, restored after)."""
    from megatron.core.pipeline_parallel import schedules
    from megatron.varlen.attention import varlen_kernel

    def in_phase(phase, original):
        def run(*args, **kwargs):
            with counts.phase(phase):
                return original(*args, **kwargs)
        return run

    def one_kernel_call(original):
        @functools.wraps(original)  # the backend reads the kernel's keywords off its signature
        def run(query, key, value, *args, **kwargs):
            counts.add(KERNEL_OP)
            return _OneKernelCall.apply(counts, functools.partial(original, **kwargs), args,
                                        query, key, value)
        return run

    saved = {(schedules, "forward_step"): schedules.forward_step,
             (schedules, "backward_step"): schedules.backward_step,
             (varlen_kernel, "emulated_varlen_attn"): varlen_kernel.emulated_varlen_attn}
    schedules.forward_step = in_phase("forward", schedules.forward_step)
    schedules.backward_step = in_phase("backward", schedules.backward_step)
    varlen_kernel.emulated_varlen_attn = one_kernel_call(varlen_kernel.emulated_varlen_attn)
    try:
        yield
    finally:
        for (owner, name), value in saved.items():
            setattr(owner, name, value)


def measure(config: str, num_sequences: int, cli) -> dict:
    """One configuration: {"counts": {(phase, op, site): n}, "step_ms": median, ...}."""
    from megatron.varlen.platform.host_syncs import DispatchCounts
    from megatron.varlen_training.config.from_flags import parse_run_config
    from megatron.varlen_training.pretrain import build_data_providers
    from megatron.varlen_training.trainer import Trainer
    from megatron.varlen_training.training import train_step
    from tools.benchmark_gpu import use_device

    use_device("cpu")  # one process: it hosts its own rendezvous store (initialize.py)
    iters = cli.warmup + cli.timed + 1
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as lengths:
        lengths.write(f"{cli.tokens // num_sequences}\n")
    trainer = Trainer(parse_run_config(model_argv(
        config, num_sequences, cli.tokens, lengths.name, iters, cli.layers, cli.hidden,
        cli.heads, tuple(shlex.split(cli.extra_args))), world_size=1))
    try:
        run = trainer.start().run
        provider = build_data_providers(trainer).train
        state = trainer.setup_model_and_optimizer()
        for it in range(cli.warmup):
            train_step(run, state, provider.step_batches(it))
        counts = DispatchCounts()
        with counts, counts.phase("data"):
            batches = provider.step_batches(cli.warmup)
        with _phases(counts), counts, counts.phase("step"):
            train_step(run, state, batches)
        times = []
        for it in range(cli.warmup + 1, iters):
            step = provider.step_batches(it)
            start = time.perf_counter()
            train_step(run, state, step)
            times.append(time.perf_counter() - start)
    finally:
        trainer.close()
        os.unlink(lengths.name)
    return {"counts": dict(counts.table), "micro_batches": batches.num_microbatches,
            "step_ms": 1e3 * statistics.median(times) if times else None}


def by_phase(counts: dict) -> dict[str, int]:
    totals = collections.Counter()
    for (phase, _, _), n in counts.items():
        totals[phase] += n
    return {phase: totals[phase] for phase in PHASES}


def growth(small: dict, large: dict) -> list[tuple[str, str, str, int, int]]:
    """[(phase, op, site, count in small, count in large)] where the counts differ, largest
    difference first."""
    keys = set(small) | set(large)
    rows = [(*key, small.get(key, 0), large.get(key, 0)) for key in keys
            if small.get(key, 0) != large.get(key, 0)]
    return sorted(rows, key=lambda r: (-(r[4] - r[3]), r[:3]))


def _print_summary(results: dict) -> None:
    print(f"{'configuration':<14} {'micro-batches':>13} " +
          " ".join(f"{p:>9}" for p in PHASES) + f" {'total':>8} {'CPU ms/step':>12}")
    for name, result in results.items():
        phases = by_phase(result["counts"])
        step_ms = "-" if result["step_ms"] is None else f"{result['step_ms']:.1f}"
        print(f"{name:<14} {result['micro_batches']:>13} " +
              " ".join(f"{phases[p]:>9}" for p in PHASES) +
              f" {sum(phases.values()):>8} {step_ms:>12}")


def _print_top(name: str, counts: dict, top: int) -> None:
    print(f"--- {name}: the {top} most frequent (phase, op, site)")
    for (phase, op, site), n in collections.Counter(counts).most_common(top):
        print(f"{n:>7}  {phase:<8} {op:<28} {site}")


def _print_growth(small_name: str, large_name: str, rows: list, top: int) -> None:
    print(f"--- growth: {small_name} -> {large_name} (same tokens), sites whose count changes")
    if not rows:
        print("  none")
    for phase, op, site, small, large in rows[:top]:
        print(f"{small:>7} -> {large:<7} {phase:<8} {op:<28} {site}")


def _parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequences", default=DEFAULT_SEQUENCES,
                        help="sequences per micro-batch to compare, comma-separated")
    parser.add_argument("--tokens", type=int, default=DEFAULT_TOKENS,
                        help="tokens per micro-batch (each sequence gets tokens/N)")
    parser.add_argument("--configs", default="packed,padded")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--timed", type=int, default=3, help="steps timed after the counted one")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--json", help="write the counts here")
    parser.add_argument("--extra-args", default="",
                        help='more training flags, e.g. "--num-experts 4 --moe-router-topk 2"')
    cli = parser.parse_args(argv)
    cli.sequences = [int(n) for n in cli.sequences.split(",")]
    cli.configs = cli.configs.split(",")
    unknown = sorted(set(cli.configs) - {"packed", "padded"})
    if unknown:
        parser.error(f"--configs {','.join(unknown)}: choose from packed,padded")
    bad = [n for n in cli.sequences if n < 1 or cli.tokens % n]
    if bad:
        parser.error(f"--sequences {bad}: each must divide --tokens {cli.tokens}")
    return cli


def main(argv=None) -> int:
    cli = _parse(argv)
    results = {f"{config}-{n}": measure(config, n, cli)
               for config in cli.configs for n in cli.sequences}
    _print_summary(results)
    for config in cli.configs:
        small, large = f"{config}-{min(cli.sequences)}", f"{config}-{max(cli.sequences)}"
        _print_top(large, results[large]["counts"], cli.top)
        if small != large:
            _print_growth(small, large, growth(results[small]["counts"],
                                               results[large]["counts"]), cli.top)
    if cli.json:
        with open(cli.json, "w") as out:
            json.dump({name: {**r, "counts": [[*k, n] for k, n in r["counts"].items()]}
                       for name, r in results.items()}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
