#!/usr/bin/env python3
"""Facts about this GPU machine that the CUDA path relies on, one line each; every check runs.

    python tools/gpu_probe.py                 # on the GPU machine (part of tools/gpu_check.py)
    python tools/gpu_probe.py --device cpu    # the CPU dry run: what can run without CUDA

Lines read ``[PASS|FAIL|SKIP] name (seconds): detail``; the exit code is the number of failed
checks. The checks:

* ``env``: torch / CUDA / Triton / megatron-core / transformers versions, the device, and the
  signature of ``torch.nn.attention.varlen.varlen_attn`` (torch 2.11 has no ``enable_gqa``);
* ``kernel``: the real kernel through our attention plan (CP 1/2/4 emulated on one device, GQA
  and MHA, bf16) against the plain-torch twin in fp32;
* ``causal``: the kernel's causal mask is bottom-right aligned (3 queries, 8 keys) and its LSE
  is ``[H, T_q]``;
* ``sync_baseline``: the profiler's sync events in an EMPTY region (its own exit synchronises;
  every sync count in this repository subtracts it);
* ``bias_dropout_add``: megatron-core's compiled bias-dropout-add gives the unfused numbers;
* ``gloo``: which gloo collectives work on this device's tensors with 2 ranks on one GPU,
  among them torch's coalesced all-reduce (megatron-core's DDP) and our replacement for it
  (megatron/varlen/platform/gloo_cuda.py).
"""

from __future__ import annotations

if not __package__:  # run as `python tools/X.py`: the repository root on sys.path
    import _repo_root  # noqa: F401

import argparse
import importlib
import importlib.metadata
import inspect
import math
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

# bf16 kernel against the fp32 twin on unit-variance inputs (bf16 keeps 8 mantissa bits).
KERNEL_TOLERANCE = 5e-2
REAL_LENGTHS = [7, 16, 33, 1, 2, 3, 200, 1]
PADDED_LENGTHS = [8, 16, 40, 8, 8, 24, 200, 8]
HEADS, HEAD_DIM = 8, 64
# What the suite's optional extras need (the data and metrics ones are sent along as wheels:
# tools/gpu_wheels.py); their versions tell a failure of ours from one of the image's.
OPTIONAL_DISTRIBUTIONS = ("datasets", "pyarrow", "wandb", "tensorboard", "pytest-xdist")


class Skip(Exception):
    """The check cannot run on this device (reported as SKIP, not as a failure)."""


def _version(module: str) -> str:
    try:
        return getattr(importlib.import_module(module), "__version__", "?")
    except ImportError:
        return "missing"


def _distribution_versions(names) -> str:
    """``name version`` of each distribution, read from its metadata (nothing is imported)."""
    found = []
    for name in names:
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{name} missing")
    return ", ".join(found)


def check_env(device: str) -> str:
    import torch

    from megatron.varlen.platform.accelerator import torch_varlen_attn

    kernel = torch_varlen_attn()
    facts = [f"torch {torch.__version__} (CUDA {torch.version.cuda})",
             f"triton {_version('triton')}", f"megatron-core {_version('megatron.core')}",
             f"transformers {_version('transformers')}",
             _distribution_versions(OPTIONAL_DISTRIBUTIONS),
             f"varlen_attn{inspect.signature(kernel) if kernel else ' missing'}",
             f"cc {shutil.which('cc') or shutil.which('gcc') or 'missing'}"]
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        facts.insert(0, f"{props.name} sm{props.major}{props.minor} {props.multi_processor_count}"
                        f" SMs {props.total_memory / 2**30:.0f} GiB")
        if shutil.which("nvidia-smi"):
            query = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.sm,"
                                    "clocks.max.sm,power.limit", "--format=csv,noheader"],
                                   capture_output=True, text=True, timeout=20)
            facts.append(f"nvidia-smi: {query.stdout.strip()}")
    return "; ".join(facts)


def _cu(lengths):
    import torch

    return torch.tensor([0, *lengths]).cumsum(0).to(torch.int32)


def check_kernel(device: str) -> str:
    import torch

    from megatron.varlen.attention.attention_plan import build_attention_plan
    from megatron.varlen.attention.flash_attention import attend_planned
    from megatron.varlen.attention.varlen_kernel import emulated_varlen_attn
    from megatron.varlen.packing.cp_split import split_thd_for_cp

    if device != "cuda":
        raise Skip("the real kernel runs on CUDA only (CPU tests use its twin)")
    gen = torch.Generator(device="cuda").manual_seed(0)
    padded, worst = _cu(PADDED_LENGTHS), {}
    for cp in (1, 2, 4):
        for groups in (2, HEADS):
            q, k, v = (torch.randn(sum(PADDED_LENGTHS), h, HEAD_DIM, device="cuda",
                                   generator=gen).bfloat16() for h in (HEADS, groups, groups))
            split = lambda x, r: split_thd_for_cp(x, padded, cp, r, seq_dim=0)  # noqa: E731
            k_rows = torch.cat([split(k, r) for r in range(cp)])
            v_rows = torch.cat([split(v, r) for r in range(cp)])
            for rank in range(cp):
                plan = build_attention_plan(_cu(REAL_LENGTHS), padded, cp, rank).to(q.device)
                got = attend_planned(split(q, rank), k_rows, v_rows, plan, HEAD_DIM ** -0.5)
                want = attend_planned(split(q, rank).float(), k_rows.float(), v_rows.float(),
                                      plan, HEAD_DIM ** -0.5, kernel=emulated_varlen_attn)
                error = float((got.float() - want).abs().max())
                worst[(cp, groups)] = max(worst.get((cp, groups), 0.0), error)
    bad = {key: e for key, e in worst.items() if not e < KERNEL_TOLERANCE}
    assert not bad, f"max |real - twin| over tolerance {KERNEL_TOLERANCE}: {bad}"
    return "max |real - twin| " + ", ".join(f"cp{cp}/{'gqa' if g < HEADS else 'mha'} {e:.4f}"
                                            for (cp, g), e in worst.items())


def check_causal(device: str) -> str:
    import torch

    if device != "cuda":
        raise Skip("the real kernel runs on CUDA only")
    from torch.nn.attention.varlen import AuxRequest, varlen_attn

    q, k, v = (torch.randn(n, 4, 64, device="cuda").bfloat16() for n in (3, 8, 8))
    out, lse = varlen_attn(q, k, v, _cu([3]).cuda(), _cu([8]).cuda(), 3, 8,
                           window_size=(-1, 0), return_aux=AuxRequest(lse=True))
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) / 8
    hidden = torch.arange(8, device="cuda")[None] > torch.arange(3, device="cuda")[:, None] + 5
    want = torch.einsum("hqk,khd->qhd", scores.masked_fill(hidden, -math.inf).softmax(-1),
                        v.float())
    error = float((out.float() - want).abs().max())
    assert error < KERNEL_TOLERANCE, f"bottom-right causal mismatch: max error {error}"
    return f"bottom-right, max error {error:.4f}; LSE shape {tuple(lse.shape)} for H=4, T_q=3"


def check_sync_baseline(device: str) -> str:
    from tools.sync_probe import profiled_sync_events

    if device != "cuda":
        raise Skip("no CUDA profiler events on CPU")
    result = profiled_sync_events(lambda: None)
    return f"{result['baseline']} sync event(s) in an empty profiled region (subtracted)"


def check_bias_dropout_add(device: str) -> str:
    from megatron.varlen.platform.accelerator import bias_dropout_add_fusion_keeps_numbers

    if device != "cuda":
        raise Skip("the fusion is CUDA only")
    return f"fused == unfused: {bias_dropout_add_fusion_keeps_numbers()}"


def gloo_collectives(device: str) -> dict:
    """On one rank of 2 (tests.harness.multirank): each collective's outcome on ``device``."""
    import torch
    import torch.distributed as dist

    from megatron.varlen.platform import gloo_cuda

    rank = dist.get_rank()
    x = torch.full((4,), float(rank + 1), device=device)
    ops = {
        "all_reduce": lambda: dist.all_reduce(x.clone()),
        "all_gather": lambda: dist.all_gather([torch.empty_like(x) for _ in range(2)], x),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(
            torch.empty(8, device=device), x),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(
            torch.empty(2, device=device), x.clone()),
        "broadcast": lambda: dist.broadcast(x.clone(), src=0),
        "all_to_all_single": lambda: dist.all_to_all_single(torch.empty_like(x), x),
        "coalesced all_reduce (torch, megatron-core DDP)": lambda: _coalesced(
            dist._coalescing_manager, x.clone()),  # noqa: SLF001
        "coalesced all_reduce (gloo_cuda)": lambda: _coalesced(
            gloo_cuda.grad_reduce_coalescing, x.clone(), expect=3.0),
    }
    outcome = {}
    for name, op in ops.items():
        try:
            op()
            if device == "cuda":
                torch.cuda.synchronize()
            outcome[name] = "ok"
        except Exception as error:  # noqa: BLE001 -- each outcome is a fact to report
            outcome[name] = (str(error).splitlines() or [""])[0][:120] or type(error).__name__
        print(f"    rank {rank} gloo {device} {name}: {outcome[name]}", flush=True)  # if it hangs
        dist.barrier()
    return outcome


def _coalesced(manager, tensor, expect=None):
    with manager(None):
        __import__("torch").distributed.all_reduce(tensor)
    if expect is not None:
        assert float(tensor[0]) == expect, f"sum {float(tensor[0])}, expected {expect}"


def check_gloo(device: str) -> str:
    from tests.harness.multirank import run_distributed

    outcomes = run_distributed(gloo_collectives, 2, args=(device,), timeout_s=60, device=device)
    merged = {name: outcomes[0][name] if outcomes[0][name] == outcomes[1][name]
              else f"{outcomes[0][name]} | {outcomes[1][name]}" for name in outcomes[0]}
    assert merged["coalesced all_reduce (gloo_cuda)"] == "ok", merged
    return "; ".join(f"{name}: {result}" for name, result in merged.items())


CHECKS = {
    "env": check_env, "kernel": check_kernel, "causal": check_causal,
    "sync_baseline": check_sync_baseline, "bias_dropout_add": check_bias_dropout_add,
    "gloo": check_gloo,
}


def run_check(name: str, check, device: str) -> str:
    """Runs one check; prints and returns its status (PASS, FAIL or SKIP)."""
    start = time.perf_counter()
    try:
        status, detail = "PASS", check(device)
    except Skip as reason:
        status, detail = "SKIP", str(reason)
    except Exception as error:  # noqa: BLE001 -- report it and go on to the next check
        traceback.print_exc()
        status = "FAIL"
        detail = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:400]}"
    print(f"[{status}] {name} ({time.perf_counter() - start:.1f}s): {detail}", flush=True)
    return status


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--checks", default=",".join(CHECKS), help="comma-separated subset")
    cli = parser.parse_args(argv)
    unknown = sorted(set(cli.checks.split(",")) - set(CHECKS))
    if unknown:
        parser.error(f"--checks {','.join(unknown)}: choose from {','.join(CHECKS)}")
    import torch

    if cli.device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device visible (use --device cpu for the dry run)")
    statuses = [run_check(name, CHECKS[name], cli.device) for name in cli.checks.split(",")]
    return statuses.count("FAIL")


if __name__ == "__main__":
    sys.exit(main())
