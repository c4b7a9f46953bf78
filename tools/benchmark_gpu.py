#!/usr/bin/env python3
"""GPU training throughput, side by side: our packed path, our padded path, a plain-PyTorch GPT.

    python tools/benchmark_gpu.py                       # 184M (12 layers, hidden 1024) on the GPU
    python tools/benchmark_gpu.py --sizes 184m,1.3b,2.8b
    python tools/benchmark_gpu.py --device cpu --tiny --iters 2 --warmup 1   # smoke run, CPU

One process per configuration and size (a fresh CUDA context and allocator each, its own
``--timeout``; run packed, reference, padded, whatever order ``--configs`` names them, so the
packed / reference ratio comes first), the same GPU, the same sample lengths (mock SFT,
lognormal 128-4096, mean 1024, sigma 1.1, seed 1234) and the same token budget per micro-batch:

* ``packed``: ``pretrain_gpt.py``'s path with ``--sequence-packing`` (THD micro-batches of up to
  ``--max-seqlen-per-dp-cp-rank`` tokens), ``--attention-backend auto``;
* ``padded``: the same model, every sample padded to ``--seq-length`` (micro-batches of
  budget / seq-length samples);
* ``reference``: a small plain-PyTorch GPT of the same shape written below (RoPE, FlashAttention
  through ``torch.nn.attention.varlen.varlen_attn``, bf16 autocast), fed the same lengths packed
  greedily into the same budget.

Both sides take the same optimizer step -- AdamW (torch's fused kernel: ours through
megatron.varlen_training.optimizer_kernels), lr 1e-4, weight decay 0.01, gradients clipped at norm
1.0 -- read the loss and the grad norm back once per step (what a training loop logs), and time
the same region: building the step's micro-batches, forward, backward, optimizer step.

Reported per configuration: real tokens/s, TFLOP/s per GPU and MFU against the device's dense bf16
peak (FLOPs from the REAL lengths, one formula for all three: megatron/varlen_training/flops.py),
synchronising calls per step (profiler events beyond an empty region's, forward+backward alone and
the whole step, with the ``file:line`` of each: tools/sync_probe.py), and peak memory. Writes
``REPORT.md`` and ``results.json`` (device, torch version, date) to ``--out`` (default results/gpu),
rewritten as each configuration ends.
Needs only torch, megatron-core and this repository.
"""

from __future__ import annotations

if not __package__:  # run as `python tools/X.py`: the repository root on sys.path
    import _repo_root  # noqa: F401

import argparse
import dataclasses
import datetime
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tools.sync_probe import count_sync_events, profiled_sync_events, sync_sites

REPO = Path(__file__).resolve().parents[1]
# In the order they run, whatever order --configs names them: the packed / reference ratio is
# what a session most needs, so the reference runs right after packed, and padded (slowest) last.
CONFIGS = ("packed", "reference", "padded")
DEFAULT_OUT = REPO / "results" / "gpu"
# One configuration of one size must fit one GPU command (10 minutes) with the others.
WORKER_TIMEOUT_S = 300
LEARNING_RATE = 1e-4
WEIGHT_DECAY = 0.01
CLIP_GRAD = 1.0
# Dense bf16 tensor-core peaks (TFLOP/s) by device-name fragment, most specific first.
BF16_PEAK_TFLOPS = (
    ("H200", 989.0), ("H100 PCIe", 756.0), ("H100", 989.0), ("GH200", 989.0),
    ("B200", 2250.0), ("A100", 312.0), ("L40S", 362.0), ("A10G", 125.0), ("L4", 121.0),
)
# What the workers import besides torch (megatron-core is installed from its wheel on machines
# without network: see README "GPU").
REQUIRED_MODULES = ("numpy", "megatron.core")


@dataclasses.dataclass(frozen=True)
class Shape:
    """The benchmarked model and data (defaults: the 184M GPT of README "GPU", 12 layers,
    hidden 1024, lognormal SFT lengths of mean 1024)."""

    num_layers: int = 12
    hidden_size: int = 1024
    num_heads: int = 16
    vocab_size: int = 32000
    seq_length: int = 4096           # longest sample
    tokens_per_micro_batch: int = 8192
    global_batch_size: int = 32
    min_len: int = 128
    mean_len: int = 1024
    sigma: float = 1.1
    seed: int = 1234
    bf16: bool = True
    attention_backend: str = "auto"  # ours on CUDA (CPU smoke runs use local)

    @property
    def ffn_hidden_size(self) -> int:
        return 4 * self.hidden_size

    def length_config(self) -> str:
        return json.dumps({"mode": "distribution", "type": "lognormal",
                           "min_seq_len": self.min_len, "max_seq_len": self.seq_length,
                           "mean_seq_len": self.mean_len, "lognormal_sigma": self.sigma})


    @property
    def params(self) -> int:
        """Parameters (tied embeddings, no biases, LayerNorm weights and biases)."""
        h = self.hidden_size
        per_layer = 4 * h * h + 2 * h * self.ffn_hidden_size + 4 * h
        return self.num_layers * per_layer + self.vocab_size * h + 2 * h


# The three sizes README "GPU" reports: 184M, 1.27B-class and 2.8B-class (head dim 64 / 128 /
# 128).
SIZES = {
    "184m": Shape(),
    "1.3b": Shape(num_layers=24, hidden_size=2048, num_heads=16),
    "2.8b": Shape(num_layers=32, hidden_size=2560, num_heads=20),
}
TINY = Shape(num_layers=2, hidden_size=64, num_heads=4, vocab_size=256, seq_length=128,
             tokens_per_micro_batch=256, global_batch_size=8, min_len=8, mean_len=32, bf16=False)


def megatron_argv(shape: Shape, config: str, iters: int, device: str) -> list[str]:
    """Our training flags for ``config`` ("packed" or "padded")."""
    argv = [
        "--num-layers", str(shape.num_layers), "--hidden-size", str(shape.hidden_size),
        "--num-attention-heads", str(shape.num_heads), "--ffn-hidden-size",
        str(shape.ffn_hidden_size), "--seq-length", str(shape.seq_length),
        "--max-position-embeddings", str(shape.seq_length),
        "--global-batch-size", str(shape.global_batch_size), "--train-iters", str(iters),
        "--lr", str(LEARNING_RATE), "--weight-decay", str(WEIGHT_DECAY),
        "--clip-grad", str(CLIP_GRAD), "--mock-data", "--sft", "--sft-mock-dataset-config-json",
        shape.length_config(), "--tokenizer-type", "NullTokenizer",
        "--vocab-size", str(shape.vocab_size), "--make-vocab-size-divisible-by", "128",
        "--position-embedding-type", "rope", "--disable-bias-linear",
        "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", str(shape.seed),
        "--log-interval", "1000000", "--eval-iters", "0", "--calculate-per-token-loss",
        "--attention-backend", shape.attention_backend if device == "cuda" else "local",
    ]
    if shape.bf16:
        argv.append("--bf16")
    if config == "packed":
        return argv + ["--micro-batch-size", "1", "--sequence-packing",
                       "--max-seqlen-per-dp-cp-rank", str(shape.tokens_per_micro_batch)]
    if config == "padded":
        per_micro_batch = max(1, shape.tokens_per_micro_batch // shape.seq_length)
        return argv + ["--micro-batch-size", str(per_micro_batch)]
    raise ValueError(f"no megatron argv for configuration {config!r}")


# --- pure arithmetic and reporting (CPU-tested) ---------------------------------------------

def bf16_peak_tflops(device_name: str) -> float | None:
    """The device's dense bf16 peak in TFLOP/s, None when the name is not in the table."""
    for fragment, peak in BF16_PEAK_TFLOPS:
        if fragment.lower() in device_name.lower():
            return peak
    return None


def summarise(step_times: list[float], step_tokens: list[int], step_flops: list[int],
              peak_tflops: float | None) -> dict:
    """Throughput over the measured steps: totals over totals (not a mean of ratios)."""
    seconds = sum(step_times)
    tflops = sum(step_flops) / seconds / 1e12
    return {
        "steps": len(step_times),
        "tokens_per_s": sum(step_tokens) / seconds,
        "tflops_per_gpu": tflops,
        "mfu": None if peak_tflops is None else tflops / peak_tflops,
        "step_time_s": seconds / len(step_times),
    }


def _fmt(value, pattern: str) -> str:
    return "n/a" if value is None else pattern.format(value)


def describe_shape(shape: Shape) -> str:
    """One line: the model and the data of a benchmarked size."""
    return (f"{shape.params / 1e9:.2f}B parameters: {shape.num_layers} layers, hidden "
            f"{shape.hidden_size}, {shape.num_heads} heads, vocab {shape.vocab_size}, RoPE, "
            f"{'bf16' if shape.bf16 else 'fp32'}; mock SFT lengths lognormal {shape.min_len}-"
            f"{shape.seq_length}, mean {shape.mean_len}, sigma {shape.sigma}; global batch "
            f"{shape.global_batch_size}; {shape.tokens_per_micro_batch} tokens per micro-batch; "
            f"ours with --attention-backend {shape.attention_backend}")


def _ratio_rows(results: dict[str, dict]) -> list[str]:
    ok = lambda n: n in results and not results[n].get("error")  # noqa: E731
    rows = []
    for top, bottom, label in (("packed", "reference", "packed / plain-PyTorch reference"),
                               ("packed", "padded", "packed / padded")):
        if ok(top) and ok(bottom):
            ratio = results[top]["tokens_per_s"] / results[bottom]["tokens_per_s"]
            rows.append(f"| {label} | {ratio:.2f}x |")
    return rows


def render_size(name: str, shape: Shape, results: dict[str, dict]) -> list[str]:
    """One size's section: a row per configuration, then the ratios."""
    lines = [f"## {name}", "", describe_shape(shape) + ".", "",
             "| configuration | tokens/s | TFLOP/s/GPU | MFU | syncs per step (fwd+bwd / whole "
             "step) | peak memory (GiB) | status |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for config in CONFIGS:
        r = results.get(config)
        if r is None:
            continue
        if r.get("error"):
            lines.append(f"| {config} | | | | | | {r['error']} |")
            continue
        lines.append(
            f"| {config} | {r['tokens_per_s']:,.0f} | {r['tflops_per_gpu']:.1f} | "
            f"{_fmt(r['mfu'], '{:.1%}')} | {_fmt(r['syncs_forward_backward'], '{}')} / "
            f"{_fmt(r['syncs_step'], '{}')} | {r['peak_memory_gib']:.1f} | ok |")
    ratios = _ratio_rows(results)
    if ratios:
        lines += ["", "| ratio (tokens/s) | value |", "|---|---:|", *ratios]
    sites = {config: r.get("sync_sites") for config, r in results.items() if r.get("sync_sites")}
    if sites:
        lines += ["", "Synchronising calls of one whole step, by site (`file:line` x count):", ""]
        lines += [f"- {config}: " + ", ".join(f"`{site}` x{count}" for site, count in found)
                  for config, found in sites.items()]
    return lines + [""]


def render_report(meta: dict, sizes: dict[str, tuple[Shape, dict]], command: str) -> str:
    """REPORT.md: the run's device and versions, then one section per size."""
    lines = ["# GPU training benchmark", "",
             f"Device: **{meta['device']}**; torch {meta.get('torch', '?')}; "
             f"{meta.get('date', '?')}. Command: `{command}`.", "",
             "Same optimizer step on every side (AdamW, fused kernel, clip 1.0), loss and grad "
             "norm read once per step, batch building inside the timed region. FLOPs from real "
             "lengths for every configuration (same formula); MFU against the dense bf16 peak "
             "of the device. Syncs: profiler events beyond an empty profiled region's.", ""]
    for name, (shape, results) in sizes.items():
        lines += render_size(name, shape, results)
    return "\n".join(lines)


# --- the plain-PyTorch reference GPT -----------------------------------------------------------

def build_reference_gpt(shape: Shape, device):
    """A ~60-line GPT of the same shape: pre-LN blocks, RoPE, varlen attention, GELU MLP, tied
    embeddings, no biases. Returns the module (fp32 weights; run under bf16 autocast)."""
    import torch
    from torch import nn

    from megatron.varlen.attention.varlen_kernel import call_varlen_kernel, kernel_for

    head_dim = shape.hidden_size // shape.num_heads
    kernel = kernel_for(torch.device(device))

    def rope(x, positions):  # x [T, H, D], rotate-half convention
        inv_freq = 1.0 / 10000 ** (torch.arange(0, head_dim, 2, device=x.device) / head_dim)
        angles = positions[:, None].float() * inv_freq[None, :]
        cos, sin = (torch.cat([f, f], -1)[:, None, :] for f in (angles.cos(), angles.sin()))
        x1, x2 = x.float().chunk(2, -1)
        return (x.float() * cos + torch.cat([-x2, x1], -1) * sin).to(x.dtype)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            h = shape.hidden_size
            self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
            self.qkv, self.proj = nn.Linear(h, 3 * h, bias=False), nn.Linear(h, h, bias=False)
            self.fc1 = nn.Linear(h, shape.ffn_hidden_size, bias=False)
            self.fc2 = nn.Linear(shape.ffn_hidden_size, h, bias=False)

        def forward(self, x, positions, cu, max_len):
            q, k, v = self.qkv(self.ln1(x)).view(x.size(0), 3, shape.num_heads,
                                                 head_dim).unbind(1)
            q, k = rope(q, positions), rope(k, positions)
            a = call_varlen_kernel(kernel, q, k, v, cu, cu, max_len, max_len,
                                   head_dim ** -0.5, causal=True)
            x = x + self.proj(a.reshape(x.size(0), -1))
            return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(shape.vocab_size, shape.hidden_size)
            self.blocks = nn.ModuleList(Block() for _ in range(shape.num_layers))
            self.ln_f = nn.LayerNorm(shape.hidden_size)

        def forward(self, tokens, positions, cu, max_len, labels):
            x = self.embed(tokens)
            for block in self.blocks:
                x = block(x, positions, cu, max_len)
            logits = self.ln_f(x) @ self.embed.weight.t()
            return nn.functional.cross_entropy(logits.float(), labels, reduction="sum")

    return GPT().to(device)


def greedy_packs(lengths: list[int], budget: int) -> list[list[int]]:
    """Consecutive samples packed while they fit the token budget (the reference's packer)."""
    packs, current, used = [], [], 0
    for length in lengths:
        if current and used + length > budget:
            packs.append(current)
            current, used = [], 0
        current.append(length)
        used += length
    if current:
        packs.append(current)
    return packs


# --- workers (one process per configuration) ---------------------------------------------------

def _synchronize(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _peak_memory_gib(device: str) -> float:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else 0.0


def _timed_steps(step, warmup: int, iters: int, device: str) -> list[float]:
    """Seconds of each measured call ``step(iteration)`` after ``warmup`` unmeasured ones."""
    times = []
    for it in range(warmup + iters):
        _synchronize(device)
        start = time.perf_counter()
        step(it)
        _synchronize(device)
        if it >= warmup:
            times.append(time.perf_counter() - start)
    return times


def _sync_counts(fwd_bwd, whole_step, device: str) -> dict:
    """Sync events of a forward+backward and of a whole step, and the whole step's sites
    (None on CPU: there is nothing to wait for)."""
    if device != "cuda":
        fwd_bwd()
        whole_step()
        return {"syncs_forward_backward": None, "syncs_step": None, "sync_sites": None}
    return {"syncs_forward_backward": profiled_sync_events(fwd_bwd)["events"],
            "syncs_step": profiled_sync_events(whole_step)["events"],
            "sync_sites": sync_sites(whole_step)}


def use_device(device: str) -> None:
    """Makes ``--device`` binding in this process: CPU means CPU even where a GPU is visible
    (the CPU smoke runs on a GPU machine), so our training path never picks CUDA by itself."""
    if device == "cpu":
        from megatron.varlen.platform import cpu_device

        cpu_device.force_cpu()
        cpu_device.activate()


def megatron_training(config: str, shape: Shape, steps: int, device: str):
    """Our training path for ``config`` in this process: ``(step, run, state, provider)``;
    ``step(iteration)`` does what the training loop does per iteration (build the batches,
    train, read loss and grad norm back) and returns (sum L, sum L^2, loss, grad norm)."""
    from megatron.varlen_training.config.from_flags import parse_run_config
    from megatron.varlen_training.pretrain import build_data_providers
    from megatron.varlen_training.trainer import Trainer
    from megatron.varlen_training.training import train_step

    use_device(device)
    trainer = Trainer(parse_run_config(megatron_argv(shape, config, steps, device), world_size=1))
    run = trainer.start().run
    provider = build_data_providers(trainer).train
    state = trainer.setup_model_and_optimizer()

    def step(it):
        batches = provider.step_batches(it)
        loss, grad_norm = train_step(run, state, batches)
        return (batches.seqlen_sum, batches.seqlen_squared_sum, loss, grad_norm,
                batches.seqlen_windowed_squared_sum)

    return step, run, state, provider


def _run_megatron(config: str, shape: Shape, iters: int, warmup: int, device: str) -> dict:
    from megatron.varlen_training.flops import num_floating_point_operations
    from megatron.varlen_training.optimizer_kernels import torch_adam_optimizers
    from megatron.varlen_training.training import run_forward_backward

    step, run, state, provider = megatron_training(config, shape, warmup + iters + 5, device)
    steps = []
    times = _timed_steps(lambda it: steps.append(step(it)), warmup, iters, device)
    measured = steps[warmup:]
    fwd_bwd_batches = provider.step_batches(warmup + iters)
    syncs = _sync_counts(lambda: run_forward_backward(run, state, fwd_bwd_batches, False),
                         lambda: step(warmup + iters + 1), device)
    fused = [group["fused"] for adam in torch_adam_optimizers(state.optimizer)
             for group in adam.param_groups]
    return {"times": times, "tokens": [s[0] for s in measured],
            "flops": [num_floating_point_operations(run.model, s[0], s[1], s[4])
                      for s in measured],
            "losses": [s[2] for s in measured], "fused_adam": bool(fused) and all(fused),
            **syncs}


def _reference_batches(shape: Shape, steps: int) -> list[list[list[int]]]:
    """The lengths our mock SFT dataset gives, per global batch, packed into the budget."""
    from megatron.varlen_training.config.from_flags import parse_run_config
    from megatron.varlen_training.datasets.builder import build_datasets
    from megatron.varlen_training.tokenizer import build_tokenizer

    run = parse_run_config(megatron_argv(shape, "packed", steps, "cpu"), world_size=1)
    run = dataclasses.replace(run, data=dataclasses.replace(
        run.data, train_samples=steps * shape.global_batch_size, eval_samples=0))
    dataset, _ = build_datasets(run, build_tokenizer("NullTokenizer", shape.vocab_size))
    gbs = shape.global_batch_size
    return [greedy_packs([int(dataset[i]["length"]) for i in range(s * gbs, (s + 1) * gbs)],
                         shape.tokens_per_micro_batch) for s in range(steps)]


def reference_training(shape: Shape, steps: int, device: str):
    """The plain-PyTorch reference in this process: ``(step, fwd_bwd, batches)``; ``step(packs)``
    trains on one global batch (lists of packed lengths) and returns (loss, grad norm)."""
    import torch

    torch.manual_seed(shape.seed)
    model = build_reference_gpt(shape, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE,
                                  weight_decay=WEIGHT_DECAY, fused=device == "cuda")
    batches = _reference_batches(shape, steps)
    gen = torch.Generator().manual_seed(shape.seed)

    def micro_batch(lengths):  # host-built, copied once: no sync inside the step
        tokens = torch.randint(0, shape.vocab_size, (sum(lengths) + 1,), generator=gen)
        positions = torch.cat([torch.arange(n) for n in lengths])
        cu = torch.tensor([0, *lengths]).cumsum(0).to(torch.int32)
        move = lambda t: t.to(device, non_blocking=True)  # noqa: E731 -- the plain way
        return (move(tokens[:-1]), move(positions), move(cu), max(lengths), move(tokens[1:]))

    def fwd_bwd(packs):  # the global per-token mean, as ours with --calculate-per-token-loss
        total = sum(n for pack in packs for n in pack)
        loss_sum = 0.0
        for lengths in packs:
            tokens, positions, cu, max_len, labels = micro_batch(lengths)
            with torch.autocast(device, dtype=torch.bfloat16, enabled=shape.bf16):
                loss = model(tokens, positions, cu, max_len, labels) / total
            loss.backward()
            loss_sum = loss_sum + loss.detach()
        return loss_sum

    def step(packs):
        loss = fwd_bwd(packs)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_GRAD, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss), float(grad_norm)  # read back once per step, as ours

    return step, fwd_bwd, batches


def _run_reference(shape: Shape, iters: int, warmup: int, device: str) -> dict:
    from megatron.varlen_training.config.from_flags import parse_run_config
    from megatron.varlen_training.flops import num_floating_point_operations

    step, fwd_bwd, batches = reference_training(shape, warmup + iters + 2, device)
    model = parse_run_config(megatron_argv(shape, "packed", 1, "cpu"), world_size=1).model
    flops_model = dataclasses.replace(model, padded_vocab_size=shape.vocab_size)
    losses = []
    times = _timed_steps(lambda it: losses.append(step(batches[it])[0]), warmup, iters, device)
    lengths = [[n for pack in batches[it] for n in pack] for it in range(warmup, warmup + iters)]
    syncs = _sync_counts(lambda: fwd_bwd(batches[warmup + iters]),
                         lambda: step(batches[warmup + iters + 1]), device)
    return {"times": times, "tokens": [sum(ls) for ls in lengths],
            "flops": [num_floating_point_operations(flops_model, sum(ls), sum(n * n for n in ls))
                      for ls in lengths], "losses": losses[warmup:],
            "fused_adam": device == "cuda", **syncs}


def missing_modules(names=REQUIRED_MODULES) -> list[str]:
    """The required modules this interpreter cannot import."""
    missing = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # a parent package is missing
            found = False
        if not found:
            missing.append(name)
    return missing


def run_worker(config: str, shape: Shape, iters: int, warmup: int, device: str) -> dict:
    """Runs one configuration in this process; returns its JSON-able result."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("benchmark_gpu.py: no CUDA device visible (use --device cpu for the "
                         "smoke run)")
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    if config == "reference":
        raw = _run_reference(shape, iters, warmup, device)
    else:
        raw = _run_megatron(config, shape, iters, warmup, device)
    result = summarise(raw["times"], raw["tokens"], raw["flops"], bf16_peak_tflops(name)
                       if device == "cuda" else None)
    result.update(device=name, peak_memory_gib=_peak_memory_gib(device),
                  losses=raw["losses"], **{key: raw[key] for key in (
                      "syncs_forward_backward", "syncs_step", "sync_sites", "fused_adam")})
    return result


# --- the launcher ---------------------------------------------------------------------------------

def _launch(config: str, size: str, cli: argparse.Namespace, result_path: Path) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", config,
           *(["--tiny"] if cli.tiny else ["--sizes", size]), "--result", str(result_path),
           "--iters", str(cli.iters), "--warmup", str(cli.warmup),
           "--device", cli.device, "--attention-backend", cli.attention_backend]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in [str(REPO), os.environ.get("PYTHONPATH", "")] if p)}
    started, timeout = time.perf_counter(), cli.timeouts[config]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"error": f"exit {proc.returncode}: {tail[:200]}"}
    result = json.loads(result_path.read_text())
    result["process_s"] = round(time.perf_counter() - started, 1)
    return result


def _shape(cli: argparse.Namespace, size: str) -> Shape:
    # FlashAttention needs half precision: the tiny shape is bf16 on CUDA, fp32 on CPU.
    shape = dataclasses.replace(TINY, bf16=cli.device == "cuda") if cli.tiny else SIZES[size]
    return dataclasses.replace(  # the CPU smoke run uses the reference attention
        shape, attention_backend=cli.attention_backend if cli.device == "cuda" else "local")


def _parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--sizes", default="184m",
                        help=f"comma-separated, from {','.join(SIZES)} (ignored with --tiny)")
    parser.add_argument("--iters", type=int, default=10, help="measured steps per configuration")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured steps first")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a tiny shape (smoke runs)")
    parser.add_argument("--attention-backend", default="auto",
                        choices=("auto", "flash", "te", "local"),
                        help="our configurations' --attention-backend (ablations)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--timeout", default=str(WORKER_TIMEOUT_S),
                        help="seconds per configuration and size: one number for all, or "
                             "CONFIG=SECONDS,... (unnamed configurations: "
                             f"{WORKER_TIMEOUT_S})")
    parser.add_argument("--worker", choices=CONFIGS, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    cli = parser.parse_args(argv)
    missing = missing_modules()
    if missing:
        parser.error(f"cannot import {', '.join(missing)}: install numpy and megatron-core==0.16.1 "
                     f"(without network: the wheel recipe in README.md, section GPU)")
    for option, chosen, known in (("--configs", cli.configs, CONFIGS),
                                  ("--sizes", cli.sizes, SIZES)):
        unknown = sorted(set(x for x in chosen.split(",") if x) - set(known))
        if unknown:
            parser.error(f"{option} {','.join(unknown)}: choose from {','.join(known)}")
    try:
        cli.timeouts = parse_timeouts(cli.timeout)
    except ValueError as error:
        parser.error(str(error))
    return cli


def parse_timeouts(text: str) -> dict[str, int]:
    """``--timeout``: "90" for every configuration, or "packed=55,padded=91" (the rest get
    WORKER_TIMEOUT_S)."""
    if "=" not in text:
        pairs = [(config, text) for config in CONFIGS]
    else:
        pairs = [tuple(item.split("=", 1)) for item in text.split(",") if item]
    timeouts = dict.fromkeys(CONFIGS, WORKER_TIMEOUT_S)
    for config, seconds in pairs:
        if config not in CONFIGS or not seconds.isdigit() or int(seconds) < 1:
            raise ValueError(f"--timeout {text}: give whole seconds >= 1, for all or as "
                             f"CONFIG=SECONDS with CONFIG from {','.join(CONFIGS)}")
        timeouts[config] = int(seconds)
    return timeouts


def run_order(configs: str) -> list[str]:
    """The configurations named in ``--configs``, each once, in CONFIGS' order."""
    named = set(configs.split(","))
    return [config for config in CONFIGS if config in named]


def write_reports(out: Path, report: dict, command: str, device: str) -> None:
    """results.json and REPORT.md of the configurations done so far (rewritten after each one:
    a run cut short keeps what ended)."""
    import torch

    device = next((r["device"] for _, rs in report.values() for r in rs.values()
                   if "device" in r), device)
    meta = {"device": device, "torch": torch.__version__,
            "date": datetime.date.today().isoformat()}
    (out / "results.json").write_text(json.dumps(
        {**meta, "command": command,
         "sizes": {size: {"shape": dataclasses.asdict(shape), "results": results}
                   for size, (shape, results) in report.items()}}, indent=2))
    (out / "REPORT.md").write_text(render_report(meta, report, command))


def main(argv=None) -> int:
    cli = _parse(argv)
    sizes = ["tiny"] if cli.tiny else [s for s in cli.sizes.split(",") if s]
    if cli.worker:
        result = run_worker(cli.worker, _shape(cli, sizes[0]), cli.iters, cli.warmup, cli.device)
        cli.result.write_text(json.dumps(result))
        return 0
    command = "python tools/benchmark_gpu.py " + " ".join(argv if argv is not None
                                                          else sys.argv[1:])
    cli.out.mkdir(parents=True, exist_ok=True)
    report, ok = {}, True
    for size in sizes:
        results = report.setdefault(size, (_shape(cli, size), {}))[1]
        for config in run_order(cli.configs):
            results[config] = _launch(config, size, cli, cli.out / f".{config}.json")
            (cli.out / f".{config}.json").unlink(missing_ok=True)
            ok = ok and not results[config].get("error")
            print(f"{size} {config}: {json.dumps(results[config])}", flush=True)
            write_reports(cli.out, report, command.strip(), cli.device)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
