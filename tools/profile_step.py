#!/usr/bin/env python3
"""Where one training step's time goes, ours against the plain-PyTorch reference.

    python tools/profile_step.py --size 184m                  # on a GPU: packed and reference
    python tools/profile_step.py --device cpu --tiny --configs packed   # smoke run
    python tools/profile_step.py --size 184m --configs packed --megatron-core-rope  # RoPE before

For each configuration (tools/benchmark_gpu.py's packed / padded / reference, same shapes and
data), after warm-up steps, ``--steps`` steps run under torch.profiler. Printed per
configuration: wall time per step; GPU kernel time per step and the GPU's busy share of the
wall time (far below 1: the host, not the GPU, sets the pace); kernel launches per step; the
kernels and the host-side operators that take the most time. This is the instrument for
closing the gap to the reference: which kernels we run that it does not, and how much host
time each step spends launching them. Last, for one more step, the torch calls made from Python
counted by call site (``file:line`` of the innermost frame outside torch): where the host's
operator calls come from. ``--megatron-core-rope`` runs our layers with megatron-core's own
THD RoPE instead of one table per micro-batch (megatron/varlen/attention/packed_rope.py), for a
side-by-side profile of the two. ``--mm-shapes`` also records input shapes and prints the
matrix multiplications by shape: calls per step, host (self CPU) and device time per call. On
an H100 our ``aten::mm`` took 93 us of host time per call against the reference's 56 us over
the same shapes per pack (results/gpu/REPORT.md): per shape, equal costs point at the shape
mix, unequal ones at what surrounds the call.
"""

from __future__ import annotations

if not __package__:  # run as `python tools/X.py`: the repository root on sys.path
    import _repo_root  # noqa: F401

import argparse
import collections
import dataclasses
import sys
import time
import traceback
from pathlib import Path

from tools.benchmark_gpu import (
    CONFIGS, SIZES, TINY, megatron_training, reference_training,
)

WARMUP_STEPS = 3
TOP_ROWS = 18
# Frames of these files are the library's, not a call site (tools.sync_probe uses the same rule).
_LIBRARY_FRAGMENTS = ("/torch/", "/contextlib.py", "profile_step.py")


def _step_function(config: str, shape, steps: int, device: str):
    if config == "reference":
        step, _, batches = reference_training(shape, steps, device)
        return lambda it: step(batches[it])
    step, *_ = megatron_training(config, shape, steps, device)
    return step


def _kernel_events(prof):
    from torch.autograd import DeviceType

    return [e for e in prof.events() if e.device_type == DeviceType.CUDA]


MATMULS = ("aten::mm", "aten::addmm", "aten::bmm")


def profile_config(config: str, shape, steps: int, device: str, mm_shapes: bool = False) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    step = _step_function(config, shape, WARMUP_STEPS + steps + 1, device)
    for it in range(WARMUP_STEPS):
        step(it)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    with profile(activities=activities, record_shapes=mm_shapes) as prof:
        for it in range(WARMUP_STEPS, WARMUP_STEPS + steps):
            step(it)
        if device == "cuda":
            torch.cuda.synchronize()
    wall = (time.perf_counter() - start) / steps
    kernels = _kernel_events(prof)
    busy = sum(_device_us(e) for e in kernels) / 1e6 / steps
    print(f"=== {config}: {wall * 1e3:.1f} ms per step (profiled); GPU kernels "
          f"{busy * 1e3:.1f} ms per step ({busy / wall:.0%} busy); {len(kernels) / steps:.0f} "
          f"kernel launches per step", flush=True)
    table = prof.key_averages()
    if device == "cuda":
        print(_table(table, ("self_device_time_total", "self_cuda_time_total")))
    print(_table(table, ("self_cpu_time_total",)), flush=True)
    if mm_shapes:
        print("\n".join(matmuls_by_shape(config, prof, steps)), flush=True)
    counts = call_sites(step, WARMUP_STEPS + steps)
    print(f"--- {config}: {sum(counts.values())} torch calls from Python in one step; the most "
          f"frequent call sites:")
    for (name, where), count in counts.most_common(TOP_ROWS):
        print(f"{count:>8}  {name:<28} {where}")
    # By file too: one module's calls spread over many sites (a RoPE, an optimizer loop), and
    # which sites lead the list above shifts with the torch version.
    print(f"--- {config}: the files making the most torch calls:")
    for path, count in calls_by_file(counts).most_common(TOP_ROWS):
        print(f"{count:>8}  {path}")


def calls_by_file(counts: collections.Counter) -> collections.Counter:
    """:func:`call_sites`'s counts summed by file (``path:line`` cut at the line)."""
    files: collections.Counter = collections.Counter()
    for (_, where), count in counts.items():
        files[where.rsplit(":", 1)[0]] += count
    return files


def matmuls_by_shape(config: str, prof, steps: int) -> list[str]:
    """``--mm-shapes``: the matrix multiplications grouped by operator and input shapes, the
    most host time first."""
    rows = [e for e in prof.key_averages(group_by_input_shape=True) if e.key in MATMULS]
    rows.sort(key=lambda e: -e.self_cpu_time_total)
    lines = [f"--- {config}: matrix multiplications by input shape (per step: calls; per call: "
             f"host us (self CPU), device us)"]
    for e in rows[:TOP_ROWS]:
        lines.append(f"{e.count / steps:>8.0f}  {e.self_cpu_time_total / e.count:>9.1f}  "
                     f"{_device_us(e) / e.count:>9.1f}  {e.key:<12} {e.input_shapes}")
    return lines


def call_sites(step, iteration: int) -> collections.Counter:
    """Torch function calls ``step(iteration)`` makes from Python, by (function, call site)."""
    import torch

    from megatron.varlen.platform.host_syncs import short_path

    counts: collections.Counter = collections.Counter()

    class Counting(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            frames = [f for f in traceback.extract_stack()[:-1]
                      if not any(part in f.filename for part in _LIBRARY_FRAGMENTS)]
            where = f"{short_path(frames[-1].filename)}:{frames[-1].lineno}" if frames else "?"
            counts[(getattr(func, "__name__", str(func)), where)] += 1
            return func(*args, **(kwargs or {}))

    with Counting():
        step(iteration)
    return counts


def _device_us(event) -> float:
    for name in ("self_device_time_total", "self_cuda_time_total", "device_time"):
        if hasattr(event, name):
            return float(getattr(event, name))
    return 0.0


def _table(averages, sort_keys) -> str:
    for key in sort_keys:  # the key's name changed across torch versions
        try:
            return averages.table(sort_by=key, row_limit=TOP_ROWS, max_name_column_width=60)
        except (AttributeError, KeyError, ValueError):
            continue
    return "(no table: unknown sort keys)"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="184m", choices=sorted(SIZES))
    parser.add_argument("--configs", default="packed,reference")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--megatron-core-rope", action="store_true",
                        help="megatron-core's per-sequence THD RoPE instead of one table per "
                             "micro-batch (the comparison for the RoPE change)")
    parser.add_argument("--mm-shapes", action="store_true",
                        help="record input shapes; print the matrix multiplications by shape")
    cli = parser.parse_args(argv)
    if cli.megatron_core_rope:  # the layers' default, read when each layer runs
        from megatron.varlen.attention.cp_switching import CPSwitchingSelfAttention
        CPSwitchingSelfAttention.rope_from_one_table = False
    unknown = sorted(set(cli.configs.split(",")) - set(CONFIGS))
    if unknown:
        parser.error(f"--configs {','.join(unknown)}: choose from {','.join(CONFIGS)}")
    shape = dataclasses.replace(TINY, bf16=cli.device == "cuda") if cli.tiny else SIZES[cli.size]
    if cli.device != "cuda":
        shape = dataclasses.replace(shape, attention_backend="local")
    for config in cli.configs.split(","):  # ours first: one process, one megatron set-up
        profile_config(config, shape, cli.steps, cli.device, cli.mm_shapes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
