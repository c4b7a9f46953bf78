"""Runtime batches with fewer samples than DP replicas, or a count DP does not divide: a
replica gets one sample more than another, or none (megatron.varlen_training.data.replica_block).

Reference: the same batches on one rank. Two DP replicas, with static packing and with dynamic
CP, give the same loss, grad norm, LR and evaluation at every step (batches of 1, 3 and 1
samples), on both ranks.
"""

from tests.harness.multirank import run_distributed
from tests.unit_tests.wrap.test_wrap_runtime_batch_sizes import CONFIG, _batch

RTOL = 1e-5
SIZES = (1, 3, 1)  # samples per step: 1 < DP 2, then one DP does not divide
LAYOUTS = {"dp2": {}, "dp2_dynamic_cp": {"dynamic_context_parallel": True,
                                        "max_seqlen_per_dp_cp_rank": 16}}


def _steps(parallel: dict) -> list[tuple[float, ...]]:
    from megatron.wrap import MegatronWrap

    out = []
    with MegatronWrap({**CONFIG, "parallel": parallel}) as wrap:
        wrap.initialize().setup_model_and_optimizer()
        for step, size in enumerate(SIZES):
            evaluated = wrap.evaluate(_batch(step + len(SIZES), size))["loss"]
            metrics = wrap.train(_batch(step, size))
            out.append((metrics["loss"], metrics["grad_norm"], metrics["lr"], evaluated))
    return out


def rank_layouts(layouts: dict) -> dict:
    return {name: _steps(parallel) for name, parallel in layouts.items()}


def test_fewer_samples_than_replicas_train_as_on_one_rank():
    reference = run_distributed(rank_layouts, 1, args=({"one_rank": {}},),
                                timeout_s=240)[0]["one_rank"]
    results = run_distributed(rank_layouts, 2, args=(LAYOUTS,), timeout_s=300)
    assert len({step[0] for step in reference}) == len(SIZES)  # the loss moves
    for rank, result in enumerate(results):
        for name, steps in result.items():
            for number, (got, want) in enumerate(zip(steps, reference, strict=True), start=1):
                assert all(abs(a - b) <= RTOL * abs(b) for a, b in zip(got, want)), (
                    f"{name} rank {rank} step {number}: {got} vs one rank {want}")
