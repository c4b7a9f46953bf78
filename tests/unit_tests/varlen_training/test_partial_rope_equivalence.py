"""--rotary-percent and --rotary-seq-len-interpolation-factor (Megatron-LM's partial and
interpolated RoPE) keep packing's promise: the packed, dynamically CP-split run equals the
unpacked one (fp32, dropout 0), and the flags do act (the losses differ from full RoPE).
"""

from tests.unit_tests.varlen_training import test_packing_equivalence as packing

ITERS = ["--train-iters", "3"]
PARTIAL_ROPE = ["--rotary-percent", "0.5", "--rotary-seq-len-interpolation-factor", "2"]
DYNAMIC_CP2 = ["--dynamic-context-parallel", "--context-parallel-size", "2",
               "--max-seqlen-per-dp-cp-rank", "32"]  # sequences over 32 tokens need CP 2


def test_packed_dynamic_cp_equals_unpacked_with_partial_rope():
    unpacked = packing._losses(packing.UNPACKED + ITERS + PARTIAL_ROPE, 2)
    packed = packing._losses(packing.PACKED + ITERS + PARTIAL_ROPE + DYNAMIC_CP2, 2)
    assert len(packed) == len(unpacked) == 3
    for it, (got, ref) in enumerate(zip(packed, unpacked), start=1):
        assert abs(got - ref) <= packing.RTOL * abs(ref), (it, packed, unpacked)
    full_rope = packing._losses(packing.UNPACKED + ITERS, 2)
    assert all(full != partial for full, partial in zip(full_rope, unpacked))
