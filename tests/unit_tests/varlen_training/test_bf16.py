"""--bf16 on CPU: the packed, dynamically CP-split run trains and tracks the fp32 run.

bf16 keeps 8 bits of mantissa, so the check is closeness (1%), not equality; the fp32 runs are
where exactness is proven.
"""

import math

from tests.harness.multirank import run_distributed
from tests.harness.training_runs import loss_owner_history, train_on_this_rank
from tests.unit_tests.varlen_training.test_packing_equivalence import PACKED

BF16_RTOL = 1e-2
ARGV = PACKED + ["--dynamic-context-parallel", "--context-parallel-size", "2",
                 "--max-seqlen-per-dp-cp-rank", "32", "--train-iters", "3"]


def _losses(argv):
    history = loss_owner_history(run_distributed(train_on_this_rank, 2, args=(argv,),
                                                 timeout_s=300))
    return [h["lm_loss"] for h in history]


def test_bf16_tracks_fp32():
    fp32 = _losses(ARGV)
    bf16 = _losses(ARGV + ["--bf16"])
    assert all(math.isfinite(x) for x in bf16), bf16
    for got, ref in zip(bf16, fp32):
        assert abs(got - ref) <= BF16_RTOL * ref, (bf16, fp32)
