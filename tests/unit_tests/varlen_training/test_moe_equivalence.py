"""MoE: packing, dynamic CP and expert parallelism never change the numbers.

Same mock SFT data, seed and model (4 experts, top-2, a shared expert, hidden 32, fp32, dropout
0) with the sequence-level balancing loss and the z-loss on. Reference: an unpacked run
(padded [b, s] micro-batches of 2, DP2, EP1), whose router sees each sample as one sequence with
its padding masked. Every layout must give, at every iteration, the same lm loss, the same
``seq_load_balancing_loss`` and ``z_loss`` (the token-weighted means the step reports) and the
same grad norm (the gradient of lm loss + balancing losses) within 1e-5 relative: packed DP2,
static DP2 x CP2, dynamic CP on 4 ranks, EP2 (== EP1), EP2 x DP2, TP2 + EP2 with sequence
parallelism, PP2 with dynamic CP, MTP with dynamic CP, and a hybrid M*E* stack with dynamic CP.
"""

import json

import pytest

from tests.harness.multirank import run_distributed
from tests.harness.training_runs import (
    loss_owner_history, train_hybrid_on_this_rank, train_on_this_rank,
)

RTOL = 1e-5
NUM_ITERS = 3
LENGTHS = json.dumps({"mode": "distribution", "type": "lognormal", "min_seq_len": 1,
                      "max_seq_len": 64, "mean_seq_len": 20, "lognormal_sigma": 1.0})
MOE = [
    "--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "16",
    "--moe-shared-expert-intermediate-size", "16", "--disable-bias-linear",
    "--moe-router-load-balancing-type", "seq_aux_loss", "--moe-aux-loss-coeff", "0.1",
    "--moe-z-loss-coeff", "0.01",
]
COMMON = MOE + [
    "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "64",
    "--global-batch-size", "8", "--train-iters", str(NUM_ITERS), "--lr", "2e-3", "--mock-data",
    "--sft", "--sft-mock-dataset-config-json", LENGTHS, "--tokenizer-type", "NullTokenizer",
    "--vocab-size", "128", "--make-vocab-size-divisible-by", "32", "--hidden-dropout", "0",
    "--attention-dropout", "0", "--position-embedding-type", "rope", "--log-interval", "1",
    "--eval-iters", "0", "--seed", "11", "--calculate-per-token-loss",
]
GPT = COMMON + ["--num-layers", "2"]
HYBRID = COMMON + ["--num-layers", "4", "--hybrid-override-pattern", "M*E*",
                   "--mamba-head-dim", "4", "--mamba-num-groups", "2", "--mamba-state-dim", "8"]
UNPACKED = ["--micro-batch-size", "2"]
PACKED = ["--micro-batch-size", "1", "--sequence-packing"]
DYNAMIC = PACKED + ["--dynamic-context-parallel"]
MTP = ["--mtp-num-layers", "1"]
METRICS = ("lm_loss", "seq_load_balancing_loss", "z_loss", "grad_norm")

# name: (model argv, layout argv, world size, reference key)
LAYOUTS = {
    "packed_dp2": (GPT, PACKED, 2, "gpt"),
    "static_dp2_cp2": (GPT, PACKED + ["--context-parallel-size", "2"], 4, "gpt"),
    "dynamic_dp2_cp2": (GPT, DYNAMIC + ["--context-parallel-size", "2",
                                        "--max-seqlen-per-dp-cp-rank", "16"], 4, "gpt"),
    "packed_ep2": (GPT, PACKED + ["--expert-model-parallel-size", "2"], 2, "gpt"),
    "packed_ep2_dp2": (GPT, PACKED + ["--expert-model-parallel-size", "2"], 4, "gpt"),
    "packed_tp2_sp_ep2": (GPT, PACKED + ["--tensor-model-parallel-size", "2",
                                         "--sequence-parallel",
                                         "--expert-model-parallel-size", "2"], 4, "gpt"),
    "dynamic_pp2_dp2": (GPT, DYNAMIC + ["--pipeline-model-parallel-size", "2",
                                        "--max-seqlen-per-dp-cp-rank", "32"], 4, "gpt"),
    "mtp_dynamic_dp2_cp2": (GPT + MTP, DYNAMIC + ["--context-parallel-size", "2",
                                                  "--max-seqlen-per-dp-cp-rank", "16"], 4,
                            "gpt_mtp"),
    "hybrid_dynamic_dp2_cp2": (HYBRID, DYNAMIC + ["--context-parallel-size", "2",
                                                  "--max-seqlen-per-dp-cp-rank", "16"], 4,
                               "hybrid"),
}
REFERENCES = {"gpt": (GPT, train_on_this_rank), "gpt_mtp": (GPT + MTP, train_on_this_rank),
              "hybrid": (HYBRID, train_hybrid_on_this_rank)}
_CACHE = {}


def _history(argv, world, train=train_on_this_rank):
    history = loss_owner_history(run_distributed(train, world, args=(argv,), timeout_s=300))
    assert len(history) == NUM_ITERS
    return [{key: step[key] for key in METRICS} for step in history]


def _reference(key):
    if key not in _CACHE:
        model, train = REFERENCES[key]
        _CACHE[key] = _history(model + UNPACKED, 2, train)
    return _CACHE[key]


def _assert_close(got, ref, what):
    for it, (step, ref_step) in enumerate(zip(got, ref), start=1):
        for key in METRICS:
            assert step[key] == pytest.approx(ref_step[key], rel=RTOL), (
                f"{what} iteration {it} {key}: {step[key]!r} vs unpacked {ref_step[key]!r}")


def test_reference_trains_and_reports_the_losses():
    ref = _reference("gpt")
    for key in METRICS:
        assert all(step[key] is not None and step[key] > 0 for step in ref), (key, ref)
    assert len({step["lm_loss"] for step in ref}) == NUM_ITERS, ref  # updates happen


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_moe_layout_matches_unpacked(layout):
    model, extra, world, key = LAYOUTS[layout]
    train = REFERENCES[key][1]
    _assert_close(_history(model + extra, world, train), _reference(key), layout)


@pytest.mark.parametrize("kind, metric", [("aux_loss", "load_balancing_loss"),
                                          ("global_aux_loss", "global_load_balancing_loss")])
def test_micro_batch_and_global_losses_train_under_dynamic_cp(kind, metric):
    """aux_loss and global_aux_loss depend on which sequences share a micro-batch by definition
    (docs/MOE.md), so they are not compared with the unpacked run: under dynamic CP they must
    train and report Megatron-LM's metric, near 1 (the balanced value) for a fresh router."""
    model = [kind if arg == "seq_aux_loss" else arg for arg in GPT]
    history = loss_owner_history(run_distributed(
        train_on_this_rank, 4, args=(model + LAYOUTS["dynamic_dp2_cp2"][1],), timeout_s=300))
    assert len(history) == NUM_ITERS
    for step in history:
        assert step.get("seq_load_balancing_loss") is None
        assert 0.9 < step[metric] < 1.5, (kind, step)
        assert step["grad_norm"] > 0 and step["z_loss"] > 0
