"""Probe hybrid Mamba cells (model variant x layout x recompute) against the single-rank run.

    python tools/probe_hybrid_combinations.py CELL [CELL ...] [--results results/tmp/hybrid.jsonl]
    python tools/probe_hybrid_combinations.py --list

A cell is ``VARIANT/LAYOUT[/RECOMPUTE]``, e.g. ``gqa/p_tp2_sp/full_block``. Its run trains the
tiny hybrid model VARIANT names through pretrain_mamba.py's path (fp32, dropout 0, 3
iterations) on the ranks LAYOUT names and is compared with ONE reference: the same variant
unpacked (padded [b, s] micro-batches of 2) on a single rank without recomputation -- or, for
variants whose unpacked run is refused (documents cut out of pretraining samples need packing,
the Mamba scan would carry state across them; whole documents are packed by definition), packed
on a single rank. Mean-loss variants' packed cells are compared with their per-token twin
(packing implies the per-token loss). Every iteration's lm loss and grad norm (and validation
loss, where the variant evaluates) must agree within ``RTOL`` relative. Verdicts: ``equal``,
``different`` (largest relative gap and where), ``refused`` (one-line start-up error) or
``crashed`` (its last line). Each run is appended to the results file (JSON lines) and the
table of every cell run so far is printed. Launches are sequential, tiny and short: run it on a
quiet machine, and never while editing the library (the ranks import it fresh).
"""

from __future__ import annotations

if not __package__:  # run as `python tools/X.py`: the repository root on sys.path
    import _repo_root  # noqa: F401

import argparse
import json
import time
from pathlib import Path

from tests.harness.multirank import DistributedTestError, reap_runs_on_sigterm, run_distributed
from tests.harness.training_runs import loss_owner_history, train_hybrid_on_this_rank
from tools.probe_combinations import RECOMPUTE as GPT_RECOMPUTE, load_results

RTOL = 1e-5
NUM_ITERS = 3
LAUNCH_TIMEOUT_S = 300
# Every evaluation a run reports: in the loop, and at the end (validation, then the test split).
EVALUATION_KEYS = ("validation_loss", "end_validation_loss", "test_loss")
LENGTHS = json.dumps({"mode": "distribution", "type": "lognormal", "min_seq_len": 1,
                      "max_seq_len": 64, "mean_seq_len": 20, "lognormal_sigma": 1.0})
BASE = [
    "--num-layers", "4", "--hidden-size", "24", "--num-attention-heads", "4",
    "--mamba-head-dim", "4", "--mamba-num-groups", "2", "--mamba-state-dim", "8",
    "--seq-length", "64", "--global-batch-size", "8", "--train-iters", str(NUM_ITERS),
    "--lr", "2e-3", "--make-vocab-size-divisible-by", "32", "--hidden-dropout", "0",
    "--attention-dropout", "0", "--log-interval", "1",
    "--eval-iters", "0", "--seed", "5",
]
MOCK_SFT = ["--mock-data", "--sft", "--sft-mock-dataset-config-json", LENGTHS,
            "--tokenizer-type", "NullTokenizer", "--vocab-size", "128"]
SFT_JSONL = ["--sft", "--data-path", "examples/data/sft_tiny.jsonl",
             "--tokenizer-type", "ByteLevelTokenizer"]
# Mock pretraining samples cut into documents at end-of-document tokens.
DOCUMENTS = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "128",
             "--reset-attention-mask", "--reset-position-ids", "--eod-mask-loss"]
PER_TOKEN = ["--calculate-per-token-loss"]
CORPUS_PREFIX = "results/tmp/probe_hybrid_corpus_text_document"  # written on first use
WHOLE_DOCUMENTS = ["--data-path", CORPUS_PREFIX, "--split", "100,0,0", "--packing-unit",
                   "document", "--tokenizer-type", "NullTokenizer", "--vocab-size", "128",
                   "--eod-mask-loss"]


def _pattern(pattern: str, rope: bool = True) -> list[str]:
    rope_flags = ["--position-embedding-type", "rope"] if rope else []
    return ["--hybrid-override-pattern", pattern] + rope_flags


# name: (flags, the reference's layout)
VARIANTS = {
    "base": (_pattern("M*M-") + MOCK_SFT + PER_TOKEN, "u_single"),
    "mean_loss": (_pattern("M*M-") + MOCK_SFT, "u_single"),
    "gqa": (_pattern("M*M-") + MOCK_SFT + PER_TOKEN + ["--group-query-attention",
                                                      "--num-query-groups", "2"], "u_single"),
    "untied": (_pattern("M*M-") + MOCK_SFT + PER_TOKEN
               + ["--untie-embeddings-and-output-weights"], "u_single"),
    "attn_first": (_pattern("*MM-") + MOCK_SFT + PER_TOKEN, "u_single"),
    "attn_last": (_pattern("MM-*") + MOCK_SFT + PER_TOKEN, "u_single"),
    "no_attn": (_pattern("M-M-") + MOCK_SFT + PER_TOKEN, "u_single"),
    "gqa_untied_attn_last": (_pattern("MM-*") + MOCK_SFT + PER_TOKEN + [
        "--group-query-attention", "--num-query-groups", "2",
        "--untie-embeddings-and-output-weights"], "u_single"),
    "learned_pos": (_pattern("M*M-", rope=False) + MOCK_SFT + PER_TOKEN, "u_single"),
    "sft_masks": (_pattern("M*M-") + SFT_JSONL + PER_TOKEN, "u_single"),
    "sft_masks_mean": (_pattern("M*M-") + SFT_JSONL, "u_single"),
    # The byte-level vocabulary (257) pads to a multiple of this x TP (Megatron-LM's rule):
    # 512 for TP 1 and 2 alike, so the TP cells train the same model as the single rank.
    "sft_masks_vocab512": (_pattern("M*M-") + SFT_JSONL + PER_TOKEN
                           + ["--make-vocab-size-divisible-by", "256"], "u_single"),
    "documents": (_pattern("M*M-") + DOCUMENTS + PER_TOKEN, "p_single"),
    # Whole documents of an indexed corpus (--packing-unit document), cut at the longest
    # sequence the layout runs: 64 tokens in the reference and in every layout it is run on.
    "documents_whole": (_pattern("M*M-") + WHOLE_DOCUMENTS + PER_TOKEN, "p_single_64"),
    "dist_opt": (_pattern("M*M-") + MOCK_SFT + PER_TOKEN + ["--use-distributed-optimizer"],
                 "u_single"),
    # Validation after every iteration (evaluate()'s forward-only path), compared too.
    "with_eval": (_pattern("M*M-") + MOCK_SFT + PER_TOKEN + ["--eval-iters", "1",
                                                            "--eval-interval", "1"], "u_single"),
    "overlap": (_pattern("M*M-") + MOCK_SFT + PER_TOKEN + ["--overlap-grad-reduce"], "u_single"),
    "overlap_dist_opt": (_pattern("M*M-") + MOCK_SFT + PER_TOKEN + [
        "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"],
                         "u_single"),
}
UNPACKED = ["--micro-batch-size", "2"]
PACKED = ["--micro-batch-size", "1", "--sequence-packing"]
DYNAMIC = PACKED + ["--dynamic-context-parallel"]
TP2 = ["--tensor-model-parallel-size", "2"]
SP = ["--sequence-parallel"]
PP2 = ["--pipeline-model-parallel-size", "2"]
VPP2 = PP2 + ["--num-layers-per-virtual-pipeline-stage", "1"]
CP2 = ["--context-parallel-size", "2"]
MAX16 = ["--max-seqlen-per-dp-cp-rank", "16"]
MAX32 = ["--max-seqlen-per-dp-cp-rank", "32"]
# name: (flags, world size); u_ = unpacked, p_ = packed (static CP), d_ = dynamic CP.
LAYOUTS = {
    "u_single": (UNPACKED, 1),
    "u_dp2": (UNPACKED, 2),
    "u_tp2": (UNPACKED + TP2, 2),
    "u_tp2_sp": (UNPACKED + TP2 + SP, 2),
    "u_pp2": (UNPACKED + PP2, 2),
    "u_cp2": (UNPACKED + CP2, 2),
    "u_tp2_cp2": (UNPACKED + TP2 + CP2, 4),
    "p_single": (PACKED, 1),
    "p_single_64": (PACKED + ["--max-seqlen-per-dp-cp-rank", "64"], 1),
    "p_dp2": (PACKED, 2),
    "p_tp2": (PACKED + TP2, 2),
    "p_tp2_sp": (PACKED + TP2 + SP, 2),
    "p_pp2": (PACKED + PP2, 2),
    "p_vpp2": (PACKED + VPP2, 2),
    "p_cp2": (PACKED + CP2, 2),
    "p_dp2_cp2": (PACKED + CP2, 4),
    "p_tp2_cp2": (PACKED + TP2 + CP2, 4),
    "p_cp4": (PACKED + ["--context-parallel-size", "4"], 4),
    "u_cp4": (UNPACKED + ["--context-parallel-size", "4"], 4),
    "d_cp2": (DYNAMIC + CP2 + MAX32, 2),
    "d_cp4": (DYNAMIC + ["--context-parallel-size", "4"] + MAX16, 4),
    "d_dp2_cp2": (DYNAMIC + CP2 + MAX16, 4),
    "d_tp2_cp2": (DYNAMIC + TP2 + CP2 + MAX32, 4),
    "d_pp2_dp2": (DYNAMIC + PP2 + MAX32, 4),
    "d_pp2_cp2": (DYNAMIC + PP2 + CP2 + MAX32, 4),
}


# The GPT probe's recompute settings but the selective MLP one (the hybrid cells probe
# selective recomputation of core attention only).
RECOMPUTE = {name: argv for name, argv in GPT_RECOMPUTE.items() if name != "selective_mlp"}


def parse_cell(cell: str) -> tuple[str, str, str]:
    """``VARIANT/LAYOUT[/RECOMPUTE]`` -> its three names (each checked)."""
    parts = cell.split("/")
    if len(parts) == 2:
        parts.append("none")
    variant, layout, recompute = parts
    for name, table in ((variant, VARIANTS), (layout, LAYOUTS), (recompute, RECOMPUTE)):
        if name not in table:
            raise SystemExit(f"unknown cell part {name!r} in {cell!r}; one of {sorted(table)}")
    return variant, layout, recompute


def cell_argv(variant: str, layout: str, recompute: str) -> tuple[list[str], int]:
    flags, world = LAYOUTS[layout]
    return BASE + VARIANTS[variant][0] + flags + RECOMPUTE[recompute], world


# Packing implies the per-token loss (docs/PACKING.md): a mean-loss variant's packed cells are
# compared with the per-token twin's reference.
PER_TOKEN_TWIN = {"mean_loss": "base", "sft_masks_mean": "sft_masks"}


def reference_cell(variant: str, layout: str = "u_single") -> str:
    if not layout.startswith("u_"):
        variant = PER_TOKEN_TWIN.get(variant, variant)
    return f"{variant}/{VARIANTS[variant][1]}/none"


def write_corpus_once(argv: list[str]) -> None:
    """The indexed corpus WHOLE_DOCUMENTS reads (test_document_packing_equivalence's)."""
    if CORPUS_PREFIX in argv and not Path(CORPUS_PREFIX + ".idx").exists():
        from tests.unit_tests.varlen_training.test_document_packing_equivalence import (
            write_corpus,
        )

        Path(CORPUS_PREFIX).parent.mkdir(parents=True, exist_ok=True)
        write_corpus(CORPUS_PREFIX)


def run_cell(cell: str) -> dict:
    """Trains one cell: {"verdict": "ran", "losses", "grad_norms"} or refused / crashed."""
    argv, world = cell_argv(*parse_cell(cell))
    write_corpus_once(argv)
    try:
        results = run_distributed(train_hybrid_on_this_rank, world, args=(argv,),
                                  timeout_s=LAUNCH_TIMEOUT_S)
    except DistributedTestError as err:
        text = str(err)
        verdict = "refused" if "ArgumentValidationError" in text else "crashed"
        lines = [line for line in text.splitlines() if line.strip()]
        errors = [line for line in lines if "ArgumentValidationError:" in line]
        reason = (errors or lines)[-1]
        return {"verdict": verdict, "reason": reason.strip()[:400]}
    history = loss_owner_history(results)
    validation = [h[key] for h in history for key in EVALUATION_KEYS if h.get(key) is not None]
    return {"verdict": "ran", "losses": [h["lm_loss"] for h in history],
            "grad_norms": [h["grad_norm"] for h in history], "validation_losses": validation}


def compare(run: dict, reference: dict) -> dict:
    """The cell's verdict against its reference's numbers."""
    if run["verdict"] != "ran":
        return run
    worst, where = 0.0, ""
    for key in ("losses", "grad_norms", "validation_losses"):
        for it, (got, ref) in enumerate(zip(run.get(key, []), reference.get(key, [])), start=1):
            gap = abs(got - ref) / abs(ref)
            if gap > worst:
                worst, where = gap, f"{key} it{it}: {got:.8g} vs {ref:.8g}"
    verdict = "equal" if worst <= RTOL else "different"
    return {**run, "verdict": verdict, "max_rel": worst, "where": where}


def verdict_row(cell: str, rows: dict) -> dict:
    """A cell's stored run with its verdict against its reference's run."""
    variant, layout, _ = cell.split("/")
    row, reference = rows[cell], rows.get(reference_cell(variant, layout))
    if row["verdict"] != "ran" or reference is None or reference["verdict"] != "ran":
        return row
    return {"cell": cell, **compare(row, reference)}


def print_table(rows: dict) -> None:
    for cell in sorted(rows):
        row = verdict_row(cell, rows)
        detail = row.get("where") or row.get("reason", "")
        gap = f"{row['max_rel']:.1e}" if "max_rel" in row else ""
        print(f"{cell:40s} {row['verdict']:9s} {gap:8s} {detail}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cells", nargs="*")
    parser.add_argument("--results", type=Path, default=Path("results/tmp/hybrid_combos.jsonl"))
    parser.add_argument("--list", action="store_true")
    options = parser.parse_args()
    reap_runs_on_sigterm()  # a killed probe leaves no rank behind
    if options.list:
        print("variants:", " ".join(VARIANTS), "\nlayouts:", " ".join(LAYOUTS),
              "\nrecompute:", " ".join(RECOMPUTE))
        return
    options.results.parent.mkdir(parents=True, exist_ok=True)
    rows = load_results(options.results)
    cells = ["/".join(parse_cell(cell)) for cell in options.cells]
    for cell in cells:
        variant, layout, _ = cell.split("/")
        for name in (reference_cell(variant, layout), cell):
            if name in rows:
                continue
            started = time.time()
            rows[name] = {"cell": name, **run_cell(name),
                          "seconds": round(time.time() - started, 1)}
            with options.results.open("a") as out:
                out.write(json.dumps(rows[name]) + "\n")
            print("RESULT", json.dumps(verdict_row(name, rows))[:300], flush=True)
    print_table(rows)


if __name__ == "__main__":
    main()
