"""Probe feature x recompute x layout x packing cells against the single-rank unpacked run.

    python tools/probe_combinations.py CELL [CELL ...] [--results results/tmp/combos.jsonl]
    python tools/probe_combinations.py --resume CELL ...     # half + save + load + half
    python tools/probe_combinations.py --resume-on LAYOUT CELL ...  # ... the load on LAYOUT
    python tools/probe_combinations.py --eval CELL ...       # also validation and test losses
    python tools/probe_combinations.py --results A.jsonl --merge B.jsonl   # the table only
    python tools/probe_combinations.py --list | --argv CELL ...

A cell is ``FEATURE/LAYOUT[/RECOMPUTE]``, e.g. ``moe_top1/p_tp2_sp/full_uniform``. Its run trains
the tiny model FEATURE names (fp32, dropout 0, 3 iterations; mock SFT samples, or real SFT
conversations with their prompts masked for the ``sft_*`` features) on the ranks LAYOUT names
(``u_``: unpacked, ``p_``: packed, ``d_``: dynamic CP), and is compared with ONE reference: the
same model, unpacked (padded [b, s] micro-batches of 2), on a single rank, without
recomputation. Every iteration's lm loss, every reported MoE balancing loss and every
iteration's grad norm must agree within ``RTOL`` relative. With ``--eval`` both runs also
evaluate (:data:`EVAL`: at iteration 2 and at the end, validation then test split) and every
validation and test loss is compared too (cells named ``CELL+eval``). The verdict is ``equal``,
``different`` (the largest relative gap, and where), ``by definition: ...`` (a difference the
feature's definition implies: :data:`BY_DEFINITION`), ``refused`` (the one-line start-up error)
or ``crashed`` (any other failure: its last line; the traceback's tail is kept). Each verdict is
appended to the results file as one JSON object, and a table of every cell run so far is
printed (results/combinations/TABLE.md is one).

Cells run one after another, each in fresh rank processes (tests/harness/multirank.py); the
references are cached in the results file too, so a cell costs one launch once its reference
exists. docs/ARCHITECTURE.md ("What the equivalence tests check") summarises what was probed
and found; test_combination_equivalence.py keeps the cells that found something.
"""

from __future__ import annotations

if not __package__:  # run as `python tools/X.py`: the repository root on sys.path
    import _repo_root  # noqa: F401

import argparse
import json
import shlex
import tempfile
import time
from pathlib import Path

from tests.harness.multirank import DistributedTestError, reap_runs_on_sigterm, run_distributed
from tests.harness.training_runs import (
    loss_owner_history, train_hybrid_on_this_rank, train_on_this_rank,
)

RTOL = 1e-5
NUM_ITERS = 3
RESUME_ITERS = 4  # --resume: this many straight vs half + save + load + half
LAUNCH_TIMEOUT_S = 300
CRASH_TEXT_CHARS = 6000  # the tail of every failing rank's traceback, kept in the results
DETAIL_CHARS = 160  # of a verdict's detail in the printed table
LENGTHS = json.dumps({"mode": "distribution", "type": "lognormal", "min_seq_len": 1,
                      "max_seq_len": 64, "mean_seq_len": 20, "lognormal_sigma": 1.0})
BASE = [
    "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "64",
    "--global-batch-size", "8", "--train-iters", str(NUM_ITERS), "--lr", "2e-3",
    "--make-vocab-size-divisible-by", "32", "--hidden-dropout", "0",
    "--attention-dropout", "0", "--log-interval", "1", "--eval-iters", "0", "--seed", "11",
    "--disable-bias-linear",
]
# Mock SFT samples (every real token in the loss), unless a feature names other data.
MOCK_DATA = ["--mock-data", "--sft", "--sft-mock-dataset-config-json", LENGTHS,
             "--tokenizer-type", "NullTokenizer", "--vocab-size", "128"]
# Real conversations: the loss on assistant tokens only (prompts masked), long ones truncated.
# The byte-level vocabulary (261 ids) padded to 320 on TP 1 and TP 2 alike (the default of 32
# here gives 288 and 320: two models; "sft_vocab_tp" keeps it to show the difference).
SAME_PADDED_VOCAB = ["--make-vocab-size-divisible-by", "160"]
SFT_JSONL = ["--sft", "--data-path", "examples/data/sft_tiny.jsonl",
             "--tokenizer-type", "ByteLevelTokenizer", *SAME_PADDED_VOCAB]
PER_TOKEN = ["--calculate-per-token-loss"]
ROPE = ["--position-embedding-type", "rope"]
MOE = ["--num-experts", "4", "--moe-ffn-hidden-size", "16"]
SEQ_AUX = ["--moe-router-load-balancing-type", "seq_aux_loss", "--moe-aux-loss-coeff", "0.1",
           "--moe-z-loss-coeff", "0.01"]
SHARED_EXPERT = ["--moe-shared-expert-intermediate-size", "16"]
TOP1 = ["--moe-router-topk", "1", "--moe-router-pre-softmax"]
# DeepSeek-V3's aux-loss-free balancing; a rate large enough for the bias to move the top-k
# choice within 3 iterations (1.1e-3 off rate 0 by iteration 3), small enough not to overshoot
# (0.05 sends every token to two experts and is back at 0 after 2 steps, so a resume check at
# iteration 2 would see no bias).
EXPERT_BIAS = ["--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
               "--moe-router-bias-update-rate", "0.01"]
MAMBA = ["--mamba-head-dim", "4", "--mamba-num-groups", "2", "--mamba-state-dim", "8"]


def _layers(count: int) -> list[str]:
    return ["--num-layers", str(count)]


# name: (model flags, hybrid). Per-token loss everywhere but "mean_loss" (packing implies it).
FEATURES = {
    "dense": (_layers(4) + ROPE + PER_TOKEN, False),
    "dense_learned": (_layers(4) + PER_TOKEN, False),
    "dense_untied": (_layers(4) + ROPE + PER_TOKEN + ["--untie-embeddings-and-output-weights"],
                     False),
    "gqa": (_layers(4) + ROPE + PER_TOKEN + ["--group-query-attention",
                                             "--num-query-groups", "2"], False),
    "gqa1": (_layers(4) + ROPE + PER_TOKEN + ["--group-query-attention",
                                              "--num-query-groups", "1"], False),
    "mean_loss": (_layers(4) + ROPE, False),
    "swiglu_rms_qkln": (_layers(4) + ROPE + PER_TOKEN + ["--swiglu", "--normalization",
                                                         "RMSNorm", "--qk-layernorm",
                                                         "--ffn-hidden-size", "64"], False),
    "rope_scaling": (_layers(4) + ROPE + PER_TOKEN + ["--use-rope-scaling",
                                                      "--rope-scaling-factor", "8"], False),
    "sft_masks": (_layers(4) + ROPE + PER_TOKEN + SFT_JSONL, False),
    "sft_vocab_tp": (_layers(4) + ROPE + PER_TOKEN + SFT_JSONL[:-2], False),
    "sft_masks_mean": (_layers(4) + ROPE + SFT_JSONL, False),
    "sft_masks_mtp": (_layers(4) + ROPE + PER_TOKEN + SFT_JSONL + ["--mtp-num-layers", "1"],
                      False),
    "sft_masks_moe": (_layers(4) + ROPE + PER_TOKEN + SFT_JSONL + MOE + SEQ_AUX, False),
    "dist_opt": (_layers(4) + ROPE + PER_TOKEN + ["--use-distributed-optimizer"], False),
    "dist_opt_mtp_learned": (_layers(4) + PER_TOKEN + ["--use-distributed-optimizer",
                                                        "--mtp-num-layers", "1"], False),
    "overlap_grad": (_layers(4) + ROPE + PER_TOKEN + ["--overlap-grad-reduce"], False),
    "mtp1": (_layers(4) + ROPE + PER_TOKEN + ["--mtp-num-layers", "1"], False),
    "mtp2": (_layers(4) + ROPE + PER_TOKEN + ["--mtp-num-layers", "2"], False),
    "mtp1_untied": (_layers(4) + ROPE + PER_TOKEN + ["--mtp-num-layers", "1",
                                                     "--untie-embeddings-and-output-weights"],
                    False),
    "mtp1_learned": (_layers(4) + PER_TOKEN + ["--mtp-num-layers", "1"], False),
    "moe": (_layers(4) + ROPE + PER_TOKEN + MOE + SEQ_AUX + SHARED_EXPERT, False),
    "moe_top1": (_layers(4) + ROPE + PER_TOKEN + MOE + SEQ_AUX + TOP1, False),
    "moe_sigmoid": (_layers(4) + ROPE + PER_TOKEN + MOE + SEQ_AUX + [
        "--moe-router-score-function", "sigmoid", "--moe-router-topk-scaling-factor", "2.0"],
                    False),
    "moe_zloss": (_layers(4) + ROPE + PER_TOKEN + MOE + ["--moe-router-load-balancing-type",
                                                         "none", "--moe-z-loss-coeff", "0.01"],
                  False),
    "moe_freq2": (_layers(4) + ROPE + PER_TOKEN + MOE + SEQ_AUX + ["--moe-layer-freq", "2"],
                  False),
    "moe_mtp1": (_layers(4) + ROPE + PER_TOKEN + MOE + SEQ_AUX + ["--mtp-num-layers", "1"],
                 False),
    "moe_aux": (_layers(4) + ROPE + PER_TOKEN + MOE + [
        "--moe-router-load-balancing-type", "aux_loss", "--moe-aux-loss-coeff", "0.1"], False),
    "moe_global_aux": (_layers(4) + ROPE + PER_TOKEN + MOE + [
        "--moe-router-load-balancing-type", "global_aux_loss", "--moe-aux-loss-coeff", "0.1"],
                       False),
    "moe_fp64_router": (_layers(4) + ROPE + PER_TOKEN + MOE + SEQ_AUX + [
        "--moe-router-dtype", "fp64"], False),
    "moe_alltoall": (_layers(4) + ROPE + PER_TOKEN + MOE + SEQ_AUX + [
        "--moe-token-dispatcher-type", "alltoall"], False),
    "moe_capacity": (_layers(4) + ROPE + PER_TOKEN + MOE + SEQ_AUX + [
        "--moe-expert-capacity-factor", "1.0"], False),
    "moe_capacity_pad": (_layers(4) + ROPE + PER_TOKEN + MOE + SEQ_AUX + [
        "--moe-expert-capacity-factor", "1.0", "--moe-pad-expert-input-to-capacity",
        "--moe-token-drop-policy", "position"], False),
    "moe_mean_loss": (_layers(4) + ROPE + MOE + SEQ_AUX, False),
    "moe_mean_zloss": (_layers(4) + ROPE + MOE + ["--moe-router-load-balancing-type", "none",
                                                  "--moe-z-loss-coeff", "0.01"], False),
    "moe_mean_seqaux": (_layers(4) + ROPE + MOE + ["--moe-router-load-balancing-type",
                                                   "seq_aux_loss", "--moe-aux-loss-coeff",
                                                   "0.1"], False),
    "moe_fp32_router": (_layers(4) + ROPE + PER_TOKEN + MOE + SEQ_AUX + [
        "--moe-router-dtype", "fp32"], False),
    "moe_pre_softmax": (_layers(4) + ROPE + PER_TOKEN + MOE + SEQ_AUX + [
        "--moe-router-pre-softmax", "--moe-router-topk-scaling-factor", "2.0"], False),
    "moe_first_dense": (_layers(4) + ROPE + PER_TOKEN + MOE + SEQ_AUX + SHARED_EXPERT + [
        "--moe-layer-freq", "([0]*1+[1]*3)"], False),
    "moe_shared_overlap": (_layers(4) + ROPE + PER_TOKEN + MOE + SEQ_AUX + SHARED_EXPERT + [
        "--moe-shared-expert-overlap", "--moe-token-dispatcher-type", "alltoall"], False),
    "moe_groups": (_layers(4) + ROPE + PER_TOKEN + MOE + SEQ_AUX + [
        "--moe-router-num-groups", "2", "--moe-router-group-topk", "1"], False),
    "moe_expert_bias": (_layers(4) + ROPE + PER_TOKEN + MOE + SEQ_AUX + EXPERT_BIAS, False),
    "moe_expert_bias_mtp": (_layers(4) + ROPE + PER_TOKEN + MOE + SEQ_AUX + EXPERT_BIAS + [
        "--mtp-num-layers", "1"], False),
    "hybrid": (_layers(4) + ROPE + PER_TOKEN + MAMBA + ["--hybrid-override-pattern", "M*M-"],
               True),
    "hybrid_mean_loss": (_layers(4) + ROPE + MAMBA + ["--hybrid-override-pattern", "M*M-"],
                         True),
    "hybrid_moe": (_layers(4) + ROPE + PER_TOKEN + MAMBA + MOE + SEQ_AUX + [
        "--hybrid-override-pattern", "M*E-"], True),
    "hybrid_moe_bias": (_layers(4) + ROPE + PER_TOKEN + MAMBA + MOE + SEQ_AUX + EXPERT_BIAS + [
        "--hybrid-override-pattern", "M*E-"], True),
}
UNPACKED = ["--micro-batch-size", "2"]
PACKED = ["--micro-batch-size", "1", "--sequence-packing"]
DYNAMIC = PACKED + ["--dynamic-context-parallel"]
TP2_SP = ["--tensor-model-parallel-size", "2", "--sequence-parallel"]
PP2 = ["--pipeline-model-parallel-size", "2"]
VPP2 = PP2 + ["--num-layers-per-virtual-pipeline-stage", "1"]
CP2 = ["--context-parallel-size", "2"]
EP2 = ["--expert-model-parallel-size", "2"]
# Uneven stages: the first stage holds one layer, the last the rest (every feature has >= 2).
PP2_UNEVEN = PP2 + ["--decoder-first-pipeline-num-layers", "1"]
# name: (flags, world size); u_ = unpacked, p_ = packed (static CP), d_ = dynamic CP.
LAYOUTS = {
    "u_single": (UNPACKED, 1),
    "u_dp2": (UNPACKED, 2),
    "u_tp2": (UNPACKED + ["--tensor-model-parallel-size", "2"], 2),
    "u_tp2_sp": (UNPACKED + TP2_SP, 2),
    "u_pp2": (UNPACKED + PP2, 2),
    "u_pp2_uneven": (UNPACKED + PP2_UNEVEN, 2),
    "u_vpp2": (UNPACKED + VPP2, 2),
    "u_cp2": (UNPACKED + CP2, 2),
    "u_dp2_cp2": (UNPACKED + CP2, 4),
    "u_ep2": (UNPACKED + EP2, 2),
    "p_single": (PACKED, 1),
    "p_dp2": (PACKED, 2),
    "p_tp2_sp": (PACKED + TP2_SP, 2),
    "p_pp2": (PACKED + PP2, 2),
    "p_pp2_uneven": (PACKED + PP2_UNEVEN, 2),
    "p_vpp2": (PACKED + VPP2, 2),
    "p_cp2": (PACKED + CP2, 2),
    "p_dp2_cp2": (PACKED + CP2, 4),
    "p_ep2": (PACKED + EP2, 2),
    "p_tp2_ep2": (PACKED + TP2_SP + EP2, 4),
    "p_tp2_ep2_etp1": (PACKED + TP2_SP + EP2 + ["--expert-tensor-parallel-size", "1"], 4),
    "p_ep2_etp2": (PACKED + EP2 + ["--expert-tensor-parallel-size", "2"], 4),
    "d_dp2": (DYNAMIC + ["--max-seqlen-per-dp-cp-rank", "32"], 2),
    "d_cp2": (DYNAMIC + CP2 + ["--max-seqlen-per-dp-cp-rank", "32"], 2),
    "d_dp2_cp2": (DYNAMIC + CP2 + ["--max-seqlen-per-dp-cp-rank", "16"], 4),
    "d_pp2_dp2": (DYNAMIC + PP2 + ["--max-seqlen-per-dp-cp-rank", "32"], 4),
    "d_pp2_uneven_dp2": (DYNAMIC + PP2_UNEVEN + ["--max-seqlen-per-dp-cp-rank", "32"], 4),
    "d_vpp2_dp2": (DYNAMIC + VPP2 + ["--max-seqlen-per-dp-cp-rank", "32"], 4),
    "d_tp2_sp_cp2": (DYNAMIC + TP2_SP + CP2 + ["--max-seqlen-per-dp-cp-rank", "32"], 4),
    "d_pp2_cp2": (DYNAMIC + PP2 + CP2 + ["--max-seqlen-per-dp-cp-rank", "32"], 4),
    "d_ep2_cp2": (DYNAMIC + EP2 + CP2 + ["--max-seqlen-per-dp-cp-rank", "32"], 2),
}


def full_recompute(method: str, layers: int) -> list[str]:
    return ["--recompute-granularity", "full", "--recompute-method", method,
            "--recompute-num-layers", str(layers)]


RECOMPUTE = {
    "none": [],
    "selective": ["--recompute-granularity", "selective"],
    "selective_mlp": ["--recompute-granularity", "selective", "--recompute-modules",
                      "core_attn", "mlp"],
    "full_uniform": full_recompute("uniform", 1),
    "full_uniform2": full_recompute("uniform", 2),
    "full_block": full_recompute("block", 1),
    "full_block2": full_recompute("block", 2),
}
REFERENCE_LAYOUT = "u_single"


def _packed(layout: str) -> bool:
    return not layout.startswith("u_")


def _tensor_parallel(layout: str) -> bool:
    return "tp2" in layout


def _flag(flags: list[str], name: str) -> int:
    return int(flags[flags.index(name) + 1]) if name in flags else 1


def _packed_or_data_parallel(layout: str) -> bool:
    """Packed, or more than one data-parallel rank (world / (TP x PP x CP))."""
    flags, world = LAYOUTS[layout]
    model_parallel = (_flag(flags, "--tensor-model-parallel-size")
                      * _flag(flags, "--pipeline-model-parallel-size")
                      * _flag(flags, "--context-parallel-size"))
    return _packed(layout) or world // model_parallel > 1


# feature -> (the layouts whose numbers differ by definition, why). aux_loss is per
# micro-batch (docs/MOE.md), so packing changes it; global_aux_loss averages the counts of the
# micro-batches that ran so far on all DP ranks together, so DP changes it too; Megatron-LM pads
# the vocabulary to a multiple of --make-vocab-size-divisible-by x TP, so TP 2 may train a
# larger output layer.
BY_DEFINITION = {
    "moe_aux": (_packed, "per micro-batch balancing loss"),
    "moe_global_aux": (_packed_or_data_parallel, "balancing loss over DP and micro-batches"),
    "sft_vocab_tp": (_tensor_parallel, "vocabulary padded by TP"),
}
# layout -> the layout that packs the same micro-batches in the same order without the model
# parallelism (PP, TP + SP, EP) the first adds. A cell whose numbers differ from the single
# rank by definition is compared with its feature on this twin too, where they must be equal:
# the definition explains the gap to the unpacked run, not one between these layouts. (VPP has
# no twin: it pads the micro-batch count to a multiple of the PP size, which changes the
# micro-batches; static CP packs up to the CP size x --max-seqlen-per-dp-cp-rank; the dynamic
# CP scheduler weighs lengths padded for sequence parallelism, so TP + SP changes its packs.)
SAME_MICROBATCHES = {
    "u_pp2": "u_single", "u_pp2_uneven": "u_single", "u_tp2_sp": "u_single", "u_cp2": "u_single",
    "u_ep2": "u_dp2",
    "u_dp2_cp2": "u_dp2",
    "p_pp2": "p_single", "p_pp2_uneven": "p_single", "p_tp2_sp": "p_single", "p_ep2": "p_dp2",
    "p_tp2_ep2": "p_dp2",
    "p_tp2_ep2_etp1": "p_dp2",
    "d_pp2_dp2": "d_dp2", "d_pp2_uneven_dp2": "d_dp2", "d_pp2_cp2": "d_cp2", "d_ep2_cp2": "d_cp2",
}
COMPARED_LOSSES = ("lm_loss", "seq_load_balancing_loss", "load_balancing_loss",
                   "global_load_balancing_loss", "z_loss",
                   "validation_loss", "end_validation_loss", "test_loss")
# --eval: two validation global batches at iteration 2 and at the end (the next two), then
# two of the test split's.
EVAL = ["--eval-iters", "2", "--eval-interval", "2"]
EVAL_SUFFIX = "+eval"
END_OF_TRAINING_KEYS = ("end_validation_loss", "test_loss")
RESUME_SUFFIX = "+resume"
# The one-line errors a run refuses its input with (a bad flag; a checkpoint it cannot continue).
REFUSALS = ("ArgumentValidationError", "CheckpointError")


def parse_cell(cell: str) -> tuple[str, str, str]:
    """``FEATURE/LAYOUT[/RECOMPUTE]`` -> its three names (each checked)."""
    parts = cell.split("/")
    if len(parts) == 2:
        parts.append("none")
    if len(parts) != 3:
        raise SystemExit(f"cell {cell!r}: expected FEATURE/LAYOUT[/RECOMPUTE]")
    for name, table in zip(parts, (FEATURES, LAYOUTS, RECOMPUTE)):
        if name not in table:
            raise SystemExit(f"cell {cell!r}: unknown {name!r} (choose from {sorted(table)})")
    return parts[0], parts[1], parts[2]


def cell_argv(feature: str, layout: str, recompute: str) -> tuple[list[str], int, bool]:
    model, hybrid = FEATURES[feature]
    flags, world = LAYOUTS[layout]
    data = [] if "--data-path" in model else MOCK_DATA
    return BASE + data + model + flags + RECOMPUTE[recompute], world, hybrid


def _summary(history: list[dict]) -> list[dict]:
    """The compared numbers of each iteration (None where the run has none)."""
    return [{key: step.get(key) for key in (*COMPARED_LOSSES, "grad_norm")} for step in history]


def launch(feature: str, layout: str, recompute: str, extra: tuple = ()) -> dict:
    """One cell's run: {"status": "ran", "history": [...]} or refused / crashed with a reason.
    ``extra``: flags appended (a later flag overrides the same flag before it)."""
    argv, world, hybrid = cell_argv(feature, layout, recompute)
    argv = argv + list(extra)
    train = train_hybrid_on_this_rank if hybrid else train_on_this_rank
    try:
        results = run_distributed(train, world, args=(argv,), timeout_s=LAUNCH_TIMEOUT_S)
    except DistributedTestError as err:
        text = str(err)
        for line in text.splitlines():
            if any(f"{kind}: " in line for kind in REFUSALS):
                return {"status": "refused", "reason": line.split("Error: ", 1)[-1].strip()}
        last = [line for line in text.splitlines() if line.strip()]
        return {"status": "crashed", "reason": last[-1].strip() if last else text[:200],
                "error": text[-CRASH_TEXT_CHARS:]}
    return {"status": "ran", "history": _summary(loss_owner_history(results))}


def launch_resume(feature: str, layout: str, recompute: str, folder: str,
                  extra: tuple = (), resume_layout: str | None = None) -> dict:
    """The cell trained RESUME_ITERS straight, and half of them + save + load + the rest;
    {"status": "ran", "history": straight, "resumed": first half + resumed half} (or why not).
    ``resume_layout``: the load and the rest run on that layout instead (the straight run and
    the first half on the cell's). With :data:`EVAL` in ``extra`` the first half's
    end-of-training evaluations are dropped (the straight run has none there): the in-loop
    ones must read the same batches."""
    half = RESUME_ITERS // 2
    # the LR must not depend on the stop
    schedule = ["--lr-decay-iters", str(RESUME_ITERS), *extra]
    runs = {}
    for name, on, extra in (
            ("straight", layout, ["--train-iters", str(RESUME_ITERS)]),
            ("first", layout, ["--train-iters", str(half), "--save", folder]),
            ("resumed", resume_layout or layout,
             ["--train-iters", str(RESUME_ITERS), "--load", folder])):
        run = launch(feature, on, recompute, schedule + extra)
        if run["status"] != "ran":
            return {**run, "reason": f"{name}: {run['reason']}"}
        runs[name] = run["history"]
    runs["first"][-1].update(dict.fromkeys(END_OF_TRAINING_KEYS))
    return {"status": "ran", "history": runs["straight"],
            "resumed": runs["first"] + runs["resumed"]}


def compare(history: list[dict], reference: list[dict]) -> tuple[float, str]:
    """The largest relative gap over every compared number, and where it is."""
    worst, where = 0.0, ""
    for it, (got, ref) in enumerate(zip(history, reference), start=1):
        for key in (*COMPARED_LOSSES, "grad_norm"):
            if ref.get(key) is None and got.get(key) is None:
                continue
            if ref.get(key) is None or got.get(key) is None:
                return float("inf"), f"it {it} {key}: {got.get(key)} vs {ref.get(key)}"
            gap = abs(got[key] - ref[key]) / abs(ref[key])
            if gap > worst:
                worst, where = gap, f"it {it} {key}: {got[key]:.7g} vs {ref[key]:.7g}"
    if len(history) != len(reference):
        return float("inf"), f"{len(history)} iterations vs {len(reference)}"
    return worst, where


def load_results(path: Path) -> dict:
    """A results file (JSON lines) as {cell: record}; {} before the first cell ran."""
    if not path.exists():
        return {}
    records = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return {record["cell"]: record for record in records}


def load_table(path: Path) -> dict:
    """A printed table (results/combinations/TABLE.md) back as {cell: record}: the verdicts of
    cells whose JSON-lines results are not kept (each record: verdict, gap, detail as shown)."""
    records = {}
    for line in path.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 4 or cells[0].count("/") != 2 or cells[0] == "cell":
            continue
        name, verdict, gap, detail = cells
        status = verdict if verdict in ("refused", "crashed") else "ran"
        records[name] = {"cell": name, "status": status, "verdict": verdict,
                         "gap": float(gap) if gap else None, "detail": detail}
    return records


def _append(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(json.dumps(record) + "\n")


def _reference(feature: str, done: dict, path: Path, extra: tuple = (), suffix: str = "") -> dict:
    name = f"{feature}/{REFERENCE_LAYOUT}/none{suffix}"
    if name not in done:
        started = time.monotonic()
        record = {"cell": name, **launch(feature, REFERENCE_LAYOUT, "none", extra),
                  "seconds": round(time.monotonic() - started, 1)}
        _append(path, record)
        done[name] = record
    return done[name]


def _verdict(gap: float, feature: str, layout: str) -> str:
    if gap <= RTOL:
        return "equal"
    differs, why = BY_DEFINITION.get(feature, (lambda layout: False, ""))
    return f"by definition: {why}" if differs(layout) else "different"


def _twin_check(record: dict, feature: str, layout: str, done: dict, path: Path,
                evaluate: bool) -> None:
    """A by-definition cell against its :data:`SAME_MICROBATCHES` twin (probed first when
    new, evaluating too with ``evaluate``): ``different`` unless equal within RTOL, the twin
    named in the verdict."""
    twin_layout = SAME_MICROBATCHES.get(layout)
    if twin_layout is None:
        return
    twin = probe(f"{feature}/{twin_layout}/none", done, path, rerun=False, evaluate=evaluate)
    if twin.get("status") != "ran":
        return
    gap, where = compare(record["history"], twin["history"])
    record.update(twin=twin["cell"], twin_gap=gap)
    if gap <= RTOL:
        record["detail"] = f"== {twin_layout} ({gap:.1e}); vs reference {record['detail']}"
    else:
        record.update(verdict="different", gap=gap, detail=f"from {twin_layout}: {where}")


def probe(cell: str, done: dict, path: Path, rerun: bool, evaluate: bool = False) -> dict:
    """The cell against its reference (both evaluating with ``evaluate``: :data:`EVAL`)."""
    feature, layout, recompute = parse_cell(cell)
    extra, suffix = (EVAL, EVAL_SUFFIX) if evaluate else ((), "")
    name = f"{feature}/{layout}/{recompute}{suffix}"
    if name in done and not rerun:
        return done[name]
    if layout == REFERENCE_LAYOUT and recompute == "none":
        return _reference(feature, done, path, extra, suffix)
    reference = _reference(feature, done, path, extra, suffix)
    started = time.monotonic()
    record = {"cell": name, **launch(feature, layout, recompute, extra),
              "seconds": round(time.monotonic() - started, 1)}
    if record["status"] == "ran":
        if reference["status"] != "ran":
            record.update(verdict="no reference", detail=reference.get("reason", ""))
        else:
            gap, where = compare(record["history"], reference["history"])
            record.update(verdict=_verdict(gap, feature, layout), gap=gap, detail=where)
            if record["verdict"].startswith("by definition"):
                _twin_check(record, feature, layout, done, path, evaluate)
    else:
        record.update(verdict=record["status"], detail=record["reason"])
    _append(path, record)
    done[name] = record
    return record


def resume_name(cell: str, evaluate: bool = False, resume_layout: str | None = None) -> str:
    """The recorded name of a resume check: ``CELL[+eval]+resume[@LAYOUT]``."""
    feature, layout, recompute = parse_cell(cell)
    target = f"@{resume_layout}" if resume_layout else ""
    return (f"{feature}/{layout}/{recompute}{EVAL_SUFFIX if evaluate else ''}{RESUME_SUFFIX}"
            f"{target}")


def probe_resume(cell: str, done: dict, path: Path, rerun: bool, evaluate: bool = False,
                 resume_layout: str | None = None) -> dict:
    """The cell's resume check: half + save + load + half == straight (no reference run);
    ``evaluate``: both evaluate (:data:`EVAL`); ``resume_layout``: the load and the second
    half on that layout (a changed layout continues the straight run, or is refused)."""
    feature, layout, recompute = parse_cell(cell)
    if resume_layout is not None and resume_layout not in LAYOUTS:
        raise SystemExit(f"--resume-on {resume_layout!r}: unknown (choose from "
                         f"{sorted(LAYOUTS)})")
    extra = EVAL if evaluate else ()
    name = resume_name(cell, evaluate, resume_layout)
    if name in done and not rerun:
        return done[name]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="probe_resume_") as folder:
        record = {"cell": name, **launch_resume(feature, layout, recompute, folder, extra,
                                                resume_layout)}
    record["seconds"] = round(time.monotonic() - started, 1)
    if record["status"] == "ran":
        gap, where = compare(record["resumed"], record["history"])
        record.update(verdict="equal" if gap <= RTOL else "different", gap=gap, detail=where)
    else:
        record.update(verdict=record["status"], detail=record["reason"])
    _append(path, record)
    done[name] = record
    return record


def _names(name: str) -> list[str]:
    """A recorded cell's FEATURE, LAYOUT and RECOMPUTE (without its +eval / +resume[@LAYOUT])."""
    return name.split("+", 1)[0].split("/")


def _order(name: str) -> tuple:
    """Sort key: feature, recomputation, layout in their tables' order (evaluating cells, then
    resume checks last)."""
    feature, layout, recompute = _names(name)
    return (tuple(FEATURES).index(feature), RESUME_SUFFIX in name,
            EVAL_SUFFIX in name, tuple(RECOMPUTE).index(recompute),
            tuple(LAYOUTS).index(layout))


def _known(name: str) -> bool:
    """Whether the cell's names are all in today's tables (results may hold retired ones)."""
    feature, layout, recompute = _names(name)
    return feature in FEATURES and layout in LAYOUTS and recompute in RECOMPUTE


def table(done: dict) -> str:
    """Every probed cell (not the references) as a Markdown table, with a count per verdict."""
    cells = sorted((name for name in done if _known(name)
                    and not name.removesuffix(EVAL_SUFFIX).endswith(f"/{REFERENCE_LAYOUT}/none")),
                   key=_order)
    counts: dict = {}
    rows = ["| cell | verdict | max rel gap | where / reason |", "|---|---|---|---|"]
    for name in cells:
        record = done[name]
        verdict = record.get("verdict", record["status"])
        if verdict == "different" and "twin" not in record:  # before BY_DEFINITION named it
            feature, layout, _ = _names(name)
            verdict = _verdict(record["gap"], feature, layout)
        counts[verdict] = counts.get(verdict, 0) + 1
        gap = record.get("gap")
        detail = record.get("detail", "").replace("|", "/")[:DETAIL_CHARS].rstrip()
        rows.append(f"| {name} | {verdict} | {'' if gap is None else f'{gap:.1e}'} | {detail} |")
    summary = ", ".join(f"{count} {verdict}" for verdict, count in sorted(counts.items()))
    return f"{len(cells)} cells: {summary}\n\n" + "\n".join(rows)


def _print_argv(cells: list[str]) -> None:
    for cell in cells:
        argv, world, hybrid = cell_argv(*parse_cell(cell))
        entry = "pretrain_mamba.py" if hybrid else "pretrain_gpt.py"
        print(f"{cell}: torchrun --nproc-per-node {world} {entry} {shlex.join(argv)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cells", nargs="*", help="FEATURE/LAYOUT[/RECOMPUTE]")
    parser.add_argument("--results", type=Path, default=Path("results/tmp/combos.jsonl"))
    parser.add_argument("--rerun", action="store_true", help="run cells already in --results")
    parser.add_argument("--merge", type=Path, nargs="+",
                        help="more results files whose cells join the printed table (a .md "
                             "table adds only the cells no results file has)")
    parser.add_argument("--list", action="store_true", help="the features, layouts, recomputes")
    parser.add_argument("--argv", action="store_true", help="print each cell's flags, run nothing")
    parser.add_argument("--resume", action="store_true",
                        help=f"instead: {RESUME_ITERS} iterations straight vs half + save + "
                             f"load + half, same cell")
    parser.add_argument("--resume-on", metavar="LAYOUT", choices=sorted(LAYOUTS),
                        help="with --resume: the load and the second half on LAYOUT (a "
                             "changed parallel layout; refused cells show the one line)")
    parser.add_argument("--eval", action="store_true",
                        help=f"both runs also evaluate ({' '.join(EVAL)}): validation and test "
                             f"losses compared too")
    args = parser.parse_args()
    reap_runs_on_sigterm()  # a killed probe leaves no rank behind
    if args.list:
        for title, names in (("features", FEATURES), ("layouts", LAYOUTS),
                             ("recompute", RECOMPUTE)):
            print(f"{title}: {' '.join(names)}")
        return
    if args.argv:
        _print_argv(args.cells)
        return
    done = load_results(args.results)
    for more in args.merge or []:
        if more.suffix == ".md":  # an earlier table: its cells where no run is newer
            for name, record in load_table(more).items():
                done.setdefault(name, record)
        else:
            done.update(load_results(more))
    for cell in args.cells:
        if args.resume:
            record = probe_resume(cell, done, args.results, args.rerun, args.eval,
                                  args.resume_on)
        else:
            record = probe(cell, done, args.results, args.rerun, args.eval)
        print(f"{record['cell']}: {record.get('verdict')} {record.get('gap', '')} "
              f"{record.get('detail', '')} ({record.get('seconds')} s)", flush=True)
    print(table(done))


if __name__ == "__main__":
    main()
