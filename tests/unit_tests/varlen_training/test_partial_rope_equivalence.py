"""--rotary-percent and --rotary-seq-len-interpolation-factor (Megatron-LM's partial and
interpolated RoPE) keep packing's promise: the packed, dynamically CP-split run equals the
unpacked one (fp32, dropout 0), and the flags do act (the losses differ from full RoPE).
The three runs share one 2-rank launch.
"""

from tests.harness.multirank import run_distributed
from tests.harness.training_runs import loss_owner_history, train_each_on_this_rank
from tests.unit_tests.varlen_training import test_packing_equivalence as packing

ITERS = ["--train-iters", "3"]
PARTIAL_ROPE = ["--rotary-percent", "0.5", "--rotary-seq-len-interpolation-factor", "2"]
DYNAMIC_CP2 = ["--dynamic-context-parallel", "--context-parallel-size", "2",
               "--max-seqlen-per-dp-cp-rank", "32"]  # sequences over 32 tokens need CP 2
RUNS = {
    "unpacked": packing.UNPACKED + ITERS + PARTIAL_ROPE,
    "packed": packing.PACKED + ITERS + PARTIAL_ROPE + DYNAMIC_CP2,
    "full_rope": packing.UNPACKED + ITERS,
}


def test_packed_dynamic_cp_equals_unpacked_with_partial_rope():
    per_rank = run_distributed(train_each_on_this_rank, 2, args=(RUNS,), timeout_s=300)
    losses = {name: [step["lm_loss"] for step in
                     loss_owner_history([rank[name] for rank in per_rank])]
              for name in RUNS}
    unpacked, packed = losses["unpacked"], losses["packed"]
    assert len(packed) == len(unpacked) == 3
    for it, (got, ref) in enumerate(zip(packed, unpacked), start=1):
        assert abs(got - ref) <= packing.RTOL * abs(ref), (it, packed, unpacked)
    assert all(full != partial for full, partial in zip(losses["full_rope"], unpacked))
