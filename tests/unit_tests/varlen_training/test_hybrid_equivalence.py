"""Hybrid Mamba-Transformer (pretrain_mamba.py's path): packing and layout never change the numbers.

Reference: ONE single-rank unpacked launch (padded [b, s] micro-batches, per-sample causal
attention and scan, no parallelism at all). Every other launch must give its lm loss and grad
norm at iterations 1-3 within 1e-5 relative (a gradient off by a uniform factor leaves the
losses equal under clipping and Adam; only the grad norm shows it): unpacked DP2 x CP2 (SBHD
CP), packed DP=2 and DP2 x CP2 (static CP), dynamic CP on DP x CP = 4 and 6, with TP=2 (also
with sequence parallel) and with PP=2 -- so packed == unpacked and every layout == single rank
in one comparison each. The pattern "M*M-" puts a Mamba layer on each PP stage; 12 Mamba heads
split over every CP size the dynamic layouts use (1, 2, 4, 6) and over TP=2. Other models,
data and recomputation: test_hybrid_combinations.py.
"""

import json

import pytest

from tests.harness.multirank import run_distributed
from tests.harness.training_runs import loss_owner_history, train_hybrid_on_this_rank

RTOL = 1e-5
NUM_ITERS = 3
LENGTHS = json.dumps({"mode": "distribution", "type": "lognormal", "min_seq_len": 1,
                      "max_seq_len": 64, "mean_seq_len": 20, "lognormal_sigma": 1.0})
HYBRID = [
    "--num-layers", "4", "--hybrid-override-pattern", "M*M-", "--hidden-size", "24",
    "--num-attention-heads", "4", "--mamba-head-dim", "4", "--mamba-num-groups", "2",
    "--mamba-state-dim", "8", "--seq-length", "64", "--global-batch-size", "12",
    "--train-iters", str(NUM_ITERS), "--lr", "2e-3", "--mock-data", "--sft",
    "--sft-mock-dataset-config-json", LENGTHS, "--tokenizer-type", "NullTokenizer",
    "--vocab-size", "128", "--make-vocab-size-divisible-by", "32", "--hidden-dropout", "0",
    "--attention-dropout", "0", "--position-embedding-type", "rope", "--log-interval", "1",
    "--eval-iters", "0", "--seed", "5", "--calculate-per-token-loss",
]
UNPACKED = HYBRID + ["--micro-batch-size", "2"]
PACKED = HYBRID + ["--micro-batch-size", "1", "--sequence-packing"]
DYNAMIC = PACKED + ["--dynamic-context-parallel"]
# name: (argv, world size)
LAYOUTS = {
    "unpacked_dp2_cp2": (UNPACKED + ["--context-parallel-size", "2"], 4),  # SBHD static CP
    "packed_dp2": (PACKED, 2),
    "packed_dp2_cp2": (PACKED + ["--context-parallel-size", "2"], 4),
    "dynamic_dp2_cp2": (DYNAMIC + ["--context-parallel-size", "2",
                                   "--max-seqlen-per-dp-cp-rank", "16"], 4),
    "dynamic_dp3_cp2": (DYNAMIC + ["--context-parallel-size", "2",
                                   "--max-seqlen-per-dp-cp-rank", "16"], 6),
    "dynamic_tp2_cp2": (DYNAMIC + ["--tensor-model-parallel-size", "2",
                                   "--context-parallel-size", "2",
                                   "--max-seqlen-per-dp-cp-rank", "32"], 4),
    "dynamic_tp2_sp_cp2": (DYNAMIC + ["--tensor-model-parallel-size", "2", "--sequence-parallel",
                                      "--context-parallel-size", "2",
                                      "--max-seqlen-per-dp-cp-rank", "32"], 4),
    "dynamic_pp2_dp2": (DYNAMIC + ["--pipeline-model-parallel-size", "2",
                                   "--max-seqlen-per-dp-cp-rank", "32"], 4),
}


def _losses_and_grad_norms(argv, world):
    """(lm loss, grad norm) per iteration."""
    history = loss_owner_history(run_distributed(train_hybrid_on_this_rank, world, args=(argv,),
                                                 timeout_s=300))
    return [(h["lm_loss"], h["grad_norm"]) for h in history]


@pytest.fixture(scope="module")
def single_rank_unpacked():
    return _losses_and_grad_norms(UNPACKED, 1)


def test_reference_losses_move(single_rank_unpacked):
    assert len(single_rank_unpacked) == NUM_ITERS
    assert len({loss for loss, _ in single_rank_unpacked}) == NUM_ITERS, single_rank_unpacked


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layout_matches_single_rank_unpacked(single_rank_unpacked, layout):
    argv, world = LAYOUTS[layout]
    got = _losses_and_grad_norms(argv, world)
    assert len(got) == NUM_ITERS
    for it, (values, refs) in enumerate(zip(got, single_rank_unpacked), start=1):
        for name, value, ref in zip(("lm loss", "grad norm"), values, refs):
            assert abs(value - ref) <= RTOL * abs(ref), (
                f"{layout} iteration {it} {name}: {value!r} vs single-rank unpacked {ref!r}")
