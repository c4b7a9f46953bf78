"""The flash backend through the whole training path (CPU: the kernel's plain-torch twin).

Dynamic CP with --attention-backend flash gives the losses of the unpacked run with the local
reference attention (iterations 1-5, fp32): the plan follows every micro-batch's CP group.
The same run counts, per rank, attention plans built and flash attention calls: one plan per
micro-batch, reused by every layer. The unpacked (SBHD) path with flash gives the same losses
too (what the GPU benchmark's padded configuration runs).
"""

from tests.harness.multirank import run_distributed
from tests.harness.training_runs import train_on_this_rank
from tests.unit_tests.varlen_training.test_packing_equivalence import (
    NUM_ITERS, PACKED, RTOL, UNPACKED,
)

NUM_LAYERS = 2
DYNAMIC_FLASH = PACKED + ["--dynamic-context-parallel", "--context-parallel-size", "2",
                          "--max-seqlen-per-dp-cp-rank", "16", "--attention-backend", "flash"]


def _train_counting_plans(argv):
    from megatron.varlen.attention import attention_plan
    from megatron.varlen.attention.flash_attention import FlashVarlenCoreAttention

    counts = {"plans": 0, "calls": 0}
    build, forward = attention_plan.build_attention_plan, FlashVarlenCoreAttention._forward_thd

    def counted_build(*args, **kwargs):
        counts["plans"] += 1
        return build(*args, **kwargs)

    def counted_forward(self, *args, **kwargs):
        counts["calls"] += 1
        return forward(self, *args, **kwargs)

    attention_plan.build_attention_plan = counted_build
    FlashVarlenCoreAttention._forward_thd = counted_forward
    try:
        return {**train_on_this_rank(argv), **counts}
    finally:
        attention_plan.build_attention_plan, FlashVarlenCoreAttention._forward_thd = build, forward


def _loss_owner(results):
    return [r for r in results if r["owns_loss"]][-1]["history"]


def test_flash_dynamic_cp_matches_unpacked_local_and_plans_once_per_micro_batch():
    flash = run_distributed(_train_counting_plans, 4, args=(DYNAMIC_FLASH,), timeout_s=300)
    unpacked = lambda backend: [h["lm_loss"] for h in _loss_owner(run_distributed(  # noqa
        train_on_this_rank, 2, args=(UNPACKED + ["--attention-backend", backend],),
        timeout_s=300))]
    expected = unpacked("local")
    for name, got in (("packed dynamic CP", [h["lm_loss"] for h in _loss_owner(flash)]),
                      ("unpacked sbhd", unpacked("flash"))):
        assert len(got) == NUM_ITERS
        for it, (g, e) in enumerate(zip(got, expected), start=1):
            assert abs(g - e) <= RTOL * abs(e), f"{name} iteration {it}: flash {g!r} vs {e!r}"
    for rank in flash:
        assert rank["plans"] > 0, "the flash backend was not used"
        assert rank["calls"] == NUM_LAYERS * rank["plans"], rank  # forward: one plan, 2 layers
