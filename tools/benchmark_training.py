"""CPU training throughput, side by side: padded vs packed, static vs dynamic CP.

    python tools/benchmark_training.py --out results/training [--rounds 2]

Every configuration trains the same tiny GPT on the same mock SFT lengths (lognormal, long
tail) on 4 gloo ranks through the real pretrain_gpt.py path. Configurations run in interleaved
rounds (A B C D, A B C D, ...) so machine noise hits all of them alike; the report gives ratios
of real tokens per second (absolute times on a shared 2-core machine are noise). The first
iterations of every run are warm-up and are dropped.
"""

from __future__ import annotations

if not __package__:  # run as `python tools/X.py`: the repository root on sys.path
    import _repo_root  # noqa: F401

import argparse
import json
import statistics
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

WORLD = 4
WARMUP_ITERS = 2
SEQ_LENGTH = 1024
LENGTHS = json.dumps({"mode": "distribution", "type": "lognormal", "min_seq_len": 32,
                      "max_seq_len": SEQ_LENGTH, "mean_seq_len": 192, "lognormal_sigma": 1.2})
COMMON = [
    "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
    "--seq-length", str(SEQ_LENGTH), "--global-batch-size", "32", "--lr", "1e-3",
    "--mock-data", "--sft", "--sft-mock-dataset-config-json", LENGTHS,
    "--tokenizer-type", "NullTokenizer", "--vocab-size", "128", "--hidden-dropout", "0",
    "--attention-dropout", "0", "--position-embedding-type", "rope", "--log-interval", "1000",
    "--eval-iters", "0", "--calculate-per-token-loss",
]
CONFIGS = {
    "padded (DP4)": ["--micro-batch-size", "2"],
    "packed dp_balanced (DP4)": ["--micro-batch-size", "1", "--sequence-packing"],
    "packed static CP2 (DP2xCP2)": ["--micro-batch-size", "1", "--sequence-packing",
                                    "--context-parallel-size", "2",
                                    "--max-seqlen-per-dp-cp-rank", "512"],
    "packed dynamic CP (DP2xCP2)": ["--micro-batch-size", "1", "--dynamic-context-parallel",
                                    "--context-parallel-size", "2",
                                    "--max-seqlen-per-dp-cp-rank", "512"],
}
RATIOS = [
    ("packed / padded", "packed dp_balanced (DP4)", "padded (DP4)"),
    ("dynamic CP / static CP", "packed dynamic CP (DP2xCP2)", "packed static CP2 (DP2xCP2)"),
]


def _run(flags: list[str], iters: int, jsonl: Path) -> list[dict]:
    # Imported here: the harness pulls in torch and megatron-core, which --help and
    # tools/update_readme_tables.py (it reads RATIOS) do not need.
    from tests.harness.multirank import run_distributed
    from tests.harness.training_runs import train_on_this_rank

    argv = COMMON + flags + ["--train-iters", str(iters), "--log-metrics-jsonl", str(jsonl)]
    run_distributed(train_on_this_rank, WORLD, args=(argv,), timeout_s=900)
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    return records[WARMUP_ITERS:]


def measure(rounds: int, iters: int) -> dict[str, dict]:
    """Real tokens/s and step time per configuration, pooled over interleaved rounds."""
    pooled = {name: [] for name in CONFIGS}
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(rounds):
            for config_index, (name, flags) in enumerate(CONFIGS.items()):
                # One file per run: the metrics logger appends, a shared path would mix runs.
                path = Path(tmp) / f"round{round_index}-config{config_index}.jsonl"
                pooled[name] += _run(flags, iters, path)
                print(f"round {round_index + 1}: {name} done", flush=True)
    return {name: _summarise(records) for name, records in pooled.items()}


def _summarise(records: list[dict]) -> dict:
    tokens = sum(r["tokens"] for r in records)
    seconds = sum(r["step_time_s"] for r in records)
    return {"tokens_per_s": tokens / seconds, "iterations": len(records),
            "median_step_s": statistics.median(r["step_time_s"] for r in records),
            "num_microbatches": statistics.mean(r["num_microbatches"] for r in records),
            "padding_ratio": statistics.mean(r.get("padding_ratio", 0.0) for r in records)}


def render(results: dict[str, dict], command: str) -> str:
    lines = ["# CPU training throughput (side by side)", "",
             f"Command: `{command}`", "",
             f"{WORLD} gloo ranks, tiny GPT (2 layers, hidden 64), mock SFT lengths lognormal "
             f"32-{SEQ_LENGTH}, mean 192, sigma 1.2; global batch 32; warm-up iterations "
             "dropped; configurations interleaved round by round.", "",
             "| configuration | real tokens/s | median step (s) | micro-batches | padding ratio |",
             "|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['tokens_per_s']:.0f} | {r['median_step_s']:.3f} | "
                     f"{r['num_microbatches']:.1f} | {r['padding_ratio']:.3f} |")
    lines += ["", "| ratio | value |", "|---|---|"]
    for label, top, bottom in RATIOS:
        ratio = results[top]["tokens_per_s"] / results[bottom]["tokens_per_s"]
        lines.append(f"| {label} | {ratio:.2f}x |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/training")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--iters", type=int, default=6)
    args = parser.parse_args()
    results = measure(args.rounds, args.iters)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = f"python tools/benchmark_training.py --out {args.out} --rounds {args.rounds}"
    (out / "REPORT.md").write_text(render(results, command))
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(render(results, command))


if __name__ == "__main__":
    main()
