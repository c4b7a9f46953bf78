"""Activation recomputation's memory saving, side by side: peak host RSS (CPU) per rank.

    python tools/recompute_memory.py --out results/training [--device cuda]

The same tiny long-sequence GPT trains the same packed mock SFT batches with dynamic CP on 2 gloo
ranks through the real pretrain_gpt.py path, with recomputation off, full (uniform, 1 layer) and
selective (core attention; core attention + MLP). Each configuration runs in fresh rank processes;
each rank resets its peak-RSS mark (``/proc/self/clear_refs``) before the run and reads it
(``VmHWM``) after, so the number is the peak resident memory of set-up and training, on CPU. The
configurations run in interleaved rounds; a rank's peak is the largest over rounds. The losses of
every configuration must agree bit for bit (recomputation never changes them), which the tool
checks. This is CPU RSS: allocator caching and the Python heap count too, so the saving is a
lower bound of what the activations alone would show. ``--device cuda`` runs the ranks on the
visible GPU(s) and adds each rank's ``torch.cuda.max_memory_allocated`` (not run yet: no GPU
was lent to this measurement).
"""

from __future__ import annotations

if not __package__:  # run as `python tools/X.py`: the repository root on sys.path
    import _repo_root  # noqa: F401

import argparse
import json
import math
import re
from pathlib import Path

from tests.harness.multirank import run_distributed
from tests.harness.training_runs import loss_owner_history, train_on_this_rank

WORLD = 2
SEQ_LENGTH = 2048
LENGTHS = json.dumps({"mode": "distribution", "type": "lognormal", "min_seq_len": 768,
                      "max_seq_len": SEQ_LENGTH, "mean_seq_len": 1536, "lognormal_sigma": 0.3})
COMMON = [
    "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
    "--seq-length", str(SEQ_LENGTH), "--micro-batch-size", "1", "--global-batch-size", "4",
    "--train-iters", "2", "--lr", "1e-3", "--mock-data", "--sft",
    "--sft-mock-dataset-config-json", LENGTHS, "--tokenizer-type", "NullTokenizer",
    "--vocab-size", "128", "--hidden-dropout", "0", "--attention-dropout", "0",
    "--position-embedding-type", "rope", "--log-interval", "1000", "--eval-iters", "0",
    "--seed", "3", "--dynamic-context-parallel", "--context-parallel-size", "2",
    "--max-seqlen-per-dp-cp-rank", str(SEQ_LENGTH),
]
CONFIGS = {
    "off": [],
    "full (uniform, 1 layer)": ["--recompute-granularity", "full", "--recompute-method",
                                "uniform", "--recompute-num-layers", "1"],
    "selective (core_attn)": ["--recompute-granularity", "selective"],
}
# The MLP's checkpoint needs a model without biases (recompute_arguments.py): its own baseline.
NO_BIAS = ["--disable-bias-linear"]
CONFIGS_NO_BIAS = {
    "off, no biases": NO_BIAS,
    "selective (core_attn, mlp), no biases": NO_BIAS + [
        "--recompute-granularity", "selective", "--recompute-modules", "core_attn", "mlp"],
}
# On CUDA the same run is not bitwise reproducible from one process to the next (an H100 gave
# losses 2e-8 apart, relative, at step 2 with recomputation off vs full): there the losses must
# agree to float32 rounding; on CPU they must be equal bit for bit.
CUDA_LOSS_RTOL = 1e-6
_CLEAR_PEAK_RSS = "5"  # /proc/PID/clear_refs: "5" resets the peak RSS (VmHWM) to the current RSS
_KIB = 1024
MIB = 2**20


def _status_kib(field: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE).group(1))


def train_measuring_rss(argv: list[str]) -> dict:
    """One rank: reset the peak marks, train, report the peaks (bytes) and the history: host
    RSS always, and on CUDA ranks the peak GPU memory torch's allocator handed out."""
    import torch

    Path("/proc/self/clear_refs").write_text(_CLEAR_PEAK_RSS)
    on_gpu = torch.cuda.is_available()
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    result = train_on_this_rank(argv)
    result["peak_rss"] = _status_kib("VmHWM") * _KIB
    result["peak_gpu"] = torch.cuda.max_memory_allocated() if on_gpu else None
    return result


# Each group is compared with its own baseline (its first configuration).
GROUPS = (CONFIGS, CONFIGS_NO_BIAS)


def _same_losses(a: list[float], b: list[float], device: str) -> bool:
    if device != "cuda":
        return a == b
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=CUDA_LOSS_RTOL)
                                    for x, y in zip(a, b))


def _check_losses(losses: dict, group: dict, device: str = "cpu") -> list[float]:
    names = list(group)
    reference = losses[names[0]]
    for name in names[1:]:
        if not _same_losses(losses[name], reference, device):
            raise SystemExit(f"recomputation changed the losses: {name} {losses[name]} != "
                             f"{names[0]} {reference}")
    return reference


def _higher(old: list, ranks: list[dict], key: str) -> list:
    return [None if rank[key] is None else max(previous or 0, rank[key])
            for previous, rank in zip(old, ranks)]


def measure(rounds: int, timeout_s: float, device: str = "cpu") -> dict:
    every = {name: extra for group in GROUPS for name, extra in group.items()}
    peaks = {name: [0] * WORLD for name in every}
    gpu_peaks = {name: [None] * WORLD for name in every}
    losses = {}
    for _ in range(rounds):
        for name, extra in every.items():
            ranks = run_distributed(train_measuring_rss, WORLD, args=(COMMON + extra,),
                                    timeout_s=timeout_s, device=device)
            peaks[name] = _higher(peaks[name], ranks, "peak_rss")
            gpu_peaks[name] = _higher(gpu_peaks[name], ranks, "peak_gpu")
            losses[name] = [h["lm_loss"] for h in loss_owner_history(ranks)]
    return {"world": WORLD, "seq_length": SEQ_LENGTH, "rounds": rounds, "device": device,
            "argv": COMMON, "configs": every, "groups": [list(group) for group in GROUPS],
            "peak_rss_bytes": peaks, "peak_gpu_bytes": gpu_peaks,
            "losses": [_check_losses(losses, group, device) for group in GROUPS]}


_AGREEMENT = {False: "equal bit for bit",
              True: f"equal within a relative {CUDA_LOSS_RTOL:g} (CUDA)"}


def report(results: dict) -> str:
    peaks = results["peak_rss_bytes"]
    lines = ["# Activation recomputation: peak host RSS on CPU", "",
             f"`python tools/recompute_memory.py`: a 4-layer hidden-64 GPT (4 heads), packed "
             f"sequences of 768-{results['seq_length']} tokens, dynamic CP on "
             f"{results['world']} gloo ranks, local attention, fp32, {results['rounds']} "
             f"round(s). Peak resident memory of a rank's process over set-up and 2 iterations "
             f"(CPU RSS, not GPU memory: allocator caching and the Python heap count too). "
             f"Within each group the losses are {_AGREEMENT[results['device'] == 'cuda']}: "
             f"{results['losses']}.", "",
             "| recomputation | peak RSS, max over ranks (MiB) | vs its baseline |",
             "|---|---:|---:|"]
    lines += _rows(peaks, results["groups"])
    gpu = results.get("peak_gpu_bytes") or {}
    if any(value is not None for values in gpu.values() for value in values):
        lines += ["", f"Peak GPU memory allocated (`torch.cuda.max_memory_allocated`, "
                      f"device {results['device']}):", "",
                  "| recomputation | peak GPU memory, max over ranks (MiB) | vs its baseline |",
                  "|---|---:|---:|", *_rows(gpu, results["groups"])]
    return "\n".join(lines) + "\n"


def _rows(peaks: dict, groups: list[list[str]]) -> list[str]:
    rows = []
    for names in groups:
        base = max(peaks[names[0]])
        for name in names:
            peak = max(peaks[name])
            rows.append(f"| {name} | {peak / MIB:.0f} | {(peak - base) / MIB:+.0f} MiB "
                        f"({peak / base:.2f}x) |")
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/training", help="Folder for the report.")
    parser.add_argument("--rounds", type=int, default=1, help="Interleaved rounds.")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="Per launch.")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cuda: ranks share the visible GPU(s) over gloo and the report "
                             "adds their peak GPU memory.")
    args = parser.parse_args(argv)
    results = measure(args.rounds, args.timeout_s, args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "recompute_memory.json").write_text(json.dumps(results, indent=1) + "\n")
    text = report(results)
    (out / "RECOMPUTE_MEMORY.md").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
