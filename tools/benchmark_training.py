"""CPU training throughput, side by side: padded vs packed, static vs dynamic CP, and packed
documents vs Megatron-LM's dense reset-mask path on real text.

    python tools/benchmark_training.py --out results/training [--rounds 2]

Every configuration trains the same tiny GPT on 4 gloo ranks through the real pretrain_gpt.py
path: the SFT configurations on the same mock SFT lengths (lognormal, long tail), the document
configurations on the same pretraining samples of real text (the Python standard library's
functions and classes, tools/stdlib_corpus.py, preprocessed once under build/): every sample's
documents either separated by --reset-position-ids --reset-attention-mask --eod-mask-loss (a
dense [s, s] mask per sample) or packed, each its own sequence. Configurations run in interleaved
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
DATA_PLACEHOLDER = "{DATA}"  # the corpus's --data-path prefix, built when the benchmark runs
# Long-context samples (the regime document packing is for): 16 x 2048 = the SFT rows' tokens.
DOCUMENT_SEQ_LENGTH, DOCUMENT_BATCH = 2048, 16
DOCUMENT_COMMON = [
    "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
    "--seq-length", str(DOCUMENT_SEQ_LENGTH), "--global-batch-size", str(DOCUMENT_BATCH),
    "--lr", "1e-3",
    "--data-path", DATA_PLACEHOLDER, "--split", "98,2,0", "--tokenizer-type",
    "ByteLevelTokenizer", "--hidden-dropout", "0", "--attention-dropout", "0",
    "--position-embedding-type", "rope", "--log-interval", "1000", "--eval-iters", "0",
    "--calculate-per-token-loss", "--eod-mask-loss", "--attention-backend", "local",
]
DOCUMENT_CONFIGS = {
    "documents, dense reset mask (DP4)": ["--micro-batch-size", "2", "--reset-position-ids",
                                          "--reset-attention-mask"],
    # The same tokens per micro-batch as the dense rows' 2 samples of --seq-length.
    "documents packed (DP4)": ["--micro-batch-size", "1", "--sequence-packing",
                               "--reset-position-ids", "--reset-attention-mask",
                               "--max-seqlen-per-dp-cp-rank", str(2 * DOCUMENT_SEQ_LENGTH)],
    "documents packed, dynamic CP (DP2xCP2)": ["--micro-batch-size", "1",
                                               "--reset-position-ids",
                                               "--reset-attention-mask",
                                               "--dynamic-context-parallel",
                                               "--context-parallel-size", "2",
                                               "--max-seqlen-per-dp-cp-rank",
                                               str(DOCUMENT_SEQ_LENGTH)],
}
RATIOS = [
    ("packed / padded", "packed dp_balanced (DP4)", "padded (DP4)"),
    ("dynamic CP / static CP", "packed dynamic CP (DP2xCP2)", "packed static CP2 (DP2xCP2)"),
    ("packed documents / dense reset mask", "documents packed (DP4)",
     "documents, dense reset mask (DP4)"),
]


def all_configs(data_prefix: str) -> dict[str, list[str]]:
    """Every configuration's full flag list (the document ones reading ``data_prefix``)."""
    configs = {name: COMMON + flags for name, flags in CONFIGS.items()}
    for name, flags in DOCUMENT_CONFIGS.items():
        configs[name] = [data_prefix if flag == DATA_PLACEHOLDER else flag
                         for flag in DOCUMENT_COMMON + flags]
    return configs


def _run(flags: list[str], iters: int, jsonl: Path) -> list[dict]:
    # Imported here: the harness pulls in torch and megatron-core, which --help and
    # tools/update_readme_tables.py (it reads RATIOS) do not need.
    from tests.harness.multirank import run_distributed
    from tests.harness.training_runs import train_on_this_rank

    argv = flags + ["--train-iters", str(iters), "--log-metrics-jsonl", str(jsonl)]
    run_distributed(train_on_this_rank, WORLD, args=(argv,), timeout_s=900)
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    return records[WARMUP_ITERS:]


def measure(rounds: int, iters: int) -> dict[str, dict]:
    """Real tokens/s and step time per configuration, pooled over interleaved rounds."""
    from tests.functional_tests.corpora import stdlib_corpus

    configs = all_configs(stdlib_corpus()[0])
    pooled = {name: [] for name in configs}
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(rounds):
            for config_index, (name, flags) in enumerate(configs.items()):
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
            "padding_ratio": statistics.mean(r.get("padding_ratio", 0.0) for r in records),
            # sum L^2 over what attends as one sequence (documents, for the document rows) per
            # token: the causal attention work a step needs, in units of sequence length.
            "attention_length": sum(r["seqlen_squared_sum"] for r in records) / tokens}


def render(results: dict[str, dict], command: str) -> str:
    lines = ["# CPU training throughput (side by side)", "",
             f"Command: `{command}`", "",
             f"{WORLD} gloo ranks, tiny GPT (2 layers, hidden 64), mock SFT lengths lognormal "
             f"32-{SEQ_LENGTH}, mean 192, sigma 1.2, global batch 32; documents: "
             f"--seq-length {DOCUMENT_SEQ_LENGTH} samples of the standard library's functions "
             f"and classes (byte-level tokens, tools/stdlib_corpus.py), --eod-mask-loss, global "
             f"batch {DOCUMENT_BATCH}, the same tokens per micro-batch packed or not; warm-up "
             "iterations dropped; configurations interleaved round by round. sum L^2 / sum L: "
             "the causal attention work per token the model FLOPs count (per document on the "
             f"document rows; the dense mask still computes all {DOCUMENT_SEQ_LENGTH} x "
             f"{DOCUMENT_SEQ_LENGTH} scores of every sample). On a shared 2-core machine the "
             "ratios move from run to run, those of the configurations with more collectives "
             "(dynamic CP: more micro-batches and CP groups) most; the document rows' gain is "
             "the attention work the packed rows skip (their sum L^2 / sum L is counted per "
             "document on every row, but only they run that little).", "",
             "| configuration | real tokens/s | median step (s) | micro-batches | padding ratio "
             "| sum L^2 / sum L |",
             "|---|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['tokens_per_s']:.0f} | {r['median_step_s']:.3f} | "
                     f"{r['num_microbatches']:.1f} | {r['padding_ratio']:.3f} | "
                     f"{r['attention_length']:.0f} |")
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
