"""PP=2 with virtual stages (interleaved 1F1B) matches a single rank.

Guards a measured pitfall: batched p2p on gloo gave silently wrong gradients with PP=2 and
VPP; the CPU path must keep batch_p2p_comm off.
"""

from tests.harness.multirank import run_distributed
from tests.harness.training_runs import TINY_GPT_ARGS, loss_owner_history, train_on_this_rank

RTOL = 1e-5
BASE = TINY_GPT_ARGS + ["--num-layers", "4", "--train-iters", "3", "--global-batch-size", "8"]


def _run(extra, world):
    return loss_owner_history(
        run_distributed(train_on_this_rank, world, args=(BASE + extra,), timeout_s=240))


def test_pp2_vpp2_matches_single_rank():
    reference = _run([], 1)
    vpp = _run(["--pipeline-model-parallel-size", "2",
                "--num-layers-per-virtual-pipeline-stage", "1"], 2)
    for got, ref in zip(vpp, reference):
        assert abs(got["lm_loss"] - ref["lm_loss"]) <= RTOL * ref["lm_loss"], (got, ref)
    ref_norm = reference[0]["grad_norm"]
    assert abs(vpp[0]["grad_norm"] - ref_norm) <= RTOL * ref_norm, (vpp[0], reference[0])
