"""An unpacked micro-batch's MoE sequence map is built once per forward, not once per MoE layer.

The map of an unpacked [s, b] micro-batch (megatron/varlen/model/moe_sequences.py
``sbhd_sequence_map``: a handful of operators and, under CP or SP, an all-reduce of the real
lengths) is the same for every MoE layer of a forward: the layers share it through the cache
kept beside the micro-batch's padding mask. Counted in unpacked training runs of 4 MoE layers,
under CP 2, and with one MTP depth (whose shifted padding mask is a micro-batch of its own):
one build per forward of the decoder and one per MTP depth. The numbers of such runs are
test_moe_equivalence.py's (its unpacked reference is this path).
"""

import pytest

from tests.harness.multirank import run_distributed
from tests.unit_tests.varlen_training.test_moe_equivalence import COMMON, MTP, UNPACKED

MOE_LAYERS = 4
BASE = COMMON + UNPACKED + ["--num-layers", str(MOE_LAYERS), "--train-iters", "2"]
# name: (extra flags, maps built per forward)
CASES = {"cp2": (["--context-parallel-size", "2"], 1), "mtp_dp2": (MTP, 2)}


def _train_counting_builds(argv: list[str]) -> dict:
    from megatron.varlen.model import moe_sequences
    from megatron.varlen.model.mtp import VarlenGPTModel
    from tests.harness.training_runs import train_on_this_rank

    counts = {"builds": 0, "forwards": 0}
    build, forward = moe_sequences.sbhd_sequence_map, VarlenGPTModel.forward

    def counted_build(*args, **kwargs):
        counts["builds"] += 1
        return build(*args, **kwargs)

    def counted_forward(self, *args, **kwargs):
        counts["forwards"] += 1
        return forward(self, *args, **kwargs)

    moe_sequences.sbhd_sequence_map, VarlenGPTModel.forward = counted_build, counted_forward
    try:
        train_on_this_rank(argv)
    finally:
        moe_sequences.sbhd_sequence_map, VarlenGPTModel.forward = build, forward
    return counts


@pytest.mark.parametrize("case", list(CASES))
def test_one_map_per_forward_and_mtp_depth(case):
    extra, per_forward = CASES[case]
    for counts in run_distributed(_train_counting_builds, 2, args=(BASE + extra,),
                                  timeout_s=240):
        assert counts["forwards"] > 0, counts
        # The decoder's 4 MoE layers share one map; an MTP layer has its own.
        assert counts["builds"] == per_forward * counts["forwards"], counts
