"""Dynamic CP never changes the numbers: same lm loss as the unpacked run, iterations 1-5.

Every sequence gets its own CP group size per micro-batch (budget 16 tokens per rank, lengths
up to 64, so groups of 1, 2 and 4 ranks occur), through TP, PP, VPP and MTP, and on a DP x CP
domain of 6 ranks (not a power of two). Static packed == unpacked is shown in
test_packing_equivalence.py; each case here compares with an unpacked launch of the same model.
"""

import pytest

from tests.harness.multirank import run_distributed
from tests.harness.training_runs import loss_owner_history, train_on_this_rank
from tests.unit_tests.varlen_training.test_packing_equivalence import (
    NUM_ITERS, PACKED, RTOL, UNPACKED,
)

DYNAMIC = PACKED + ["--dynamic-context-parallel"]
FOUR_LAYERS = ["--num-layers", "4"]
MTP = ["--mtp-num-layers", "1"]
# name: (extra flags for both runs, extra flags for the dynamic run only, world size)
CASES = {
    "dp2_cp2": ([], ["--context-parallel-size", "2", "--max-seqlen-per-dp-cp-rank", "16"], 4),
    "dp1_cp4": ([], ["--context-parallel-size", "4", "--max-seqlen-per-dp-cp-rank", "16"], 4),
    "tp2_cp2": ([], ["--tensor-model-parallel-size", "2", "--context-parallel-size", "2",
                     "--max-seqlen-per-dp-cp-rank", "32"], 4),
    "pp2_dp2": ([], ["--pipeline-model-parallel-size", "2", "--max-seqlen-per-dp-cp-rank", "32"],
                4),
    "pp2_vpp2_dp2": (FOUR_LAYERS, ["--pipeline-model-parallel-size", "2",
                                   "--num-layers-per-virtual-pipeline-stage", "1",
                                   "--max-seqlen-per-dp-cp-rank", "32"], 4),
    # Middle pipeline stages need every micro-batch's metadata too (MLM #4092).
    "pp4_middle_stages": (FOUR_LAYERS, ["--pipeline-model-parallel-size", "4",
                                        "--max-seqlen-per-dp-cp-rank", "64"], 4),
    "mtp_dp2_cp2": (MTP, ["--context-parallel-size", "2", "--max-seqlen-per-dp-cp-rank", "16"],
                    4),
    # MTP's norms see sequence-parallel hidden states too (they are the decoder's VarlenNorm).
    "mtp_tp2_sp_cp2": (MTP, ["--tensor-model-parallel-size", "2", "--sequence-parallel",
                             "--context-parallel-size", "2", "--max-seqlen-per-dp-cp-rank", "32"],
                       4),
    "dp3_cp2": ([], ["--context-parallel-size", "2", "--max-seqlen-per-dp-cp-rank", "16",
                     "--global-batch-size", "12"], 6),
}
_BASELINES = {}


def _losses(argv, world):
    history = loss_owner_history(run_distributed(train_on_this_rank, world, args=(argv,),
                                                 timeout_s=300))
    return [h["lm_loss"] for h in history]


def _unpacked(shared: list[str], dynamic_only: list[str]) -> list[float]:
    gbs = dynamic_only[dynamic_only.index("--global-batch-size") + 1] \
        if "--global-batch-size" in dynamic_only else "8"
    key = (tuple(shared), gbs)
    if key not in _BASELINES:
        world = 2 if gbs == "8" else 3  # DP ranks must divide the batch into micro-batches of 2
        _BASELINES[key] = _losses(UNPACKED + shared + ["--global-batch-size", gbs], world)
    return _BASELINES[key]


@pytest.mark.parametrize("case", list(CASES))
def test_dynamic_cp_matches_unpacked(case):
    shared, dynamic_only, world = CASES[case]
    reference = _unpacked(shared, dynamic_only)
    dynamic = _losses(DYNAMIC + shared + dynamic_only, world)
    assert len(dynamic) == NUM_ITERS
    for it, (got, ref) in enumerate(zip(dynamic, reference), start=1):
        assert abs(got - ref) <= RTOL * abs(ref), (
            f"{case} iteration {it}: dynamic CP {got!r} vs unpacked {ref!r}")


def test_mtp_is_active():
    # Guards the MTP case against comparing two runs in which MTP silently did nothing.
    with_mtp = _unpacked(MTP, [])
    without = _unpacked([], [])
    assert with_mtp[0] == pytest.approx(without[0], rel=RTOL), "iteration 1 precedes any update"
    # MTP must move the trajectory by far more than the tolerance the MTP case is judged by.
    assert max(abs(a - b) / b for a, b in zip(with_mtp, without)) > 10 * RTOL, (with_mtp, without)
