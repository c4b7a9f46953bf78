"""The facade's flows on explicit batches: a layout never changes the numbers.

One launch on a single rank is the reference; one launch with PP 2 and dynamic CP on DP 2
(4 ranks: pipeline stages pass the packs' metadata; samples over 32 tokens split over a CP
group of 2) must give, on every rank, the same loss and grad norm at every step and the same
evaluate() loss, within RTOL, for two flows whose loss reads a per-token field beyond
loss_mask: gpt_sft's per-sample normalisation (its computed loss_weight) and a user flow's
per-token weights (tests/harness/wrap_layouts.py). tools/probe_wrap_layouts.py runs the other
layouts (DP2, TP2, TP2+SP, PP2, CP2, dynamic CP on 2 and 4 ranks, TP2 x dynamic CP2) and flows.
"""

import pytest

from tests.harness.multirank import run_distributed
from tests.harness.wrap_layouts import NUM_STEPS, facade_steps

RTOL = 1e-5
FLOWS = ("gpt_sft_per_sample", "test_token_weights")
PP2_DYNAMIC_CP = {"pipeline_model_parallel_size": 2, "dynamic_context_parallel": True,
                  "max_seqlen_per_dp_cp_rank": 32}


def _close(got: float, want: float) -> bool:
    return abs(got - want) <= RTOL * abs(want)


@pytest.fixture(scope="module")
def single_rank():
    return run_distributed(facade_steps, 1, args=({}, FLOWS), timeout_s=180)[0]


def test_flows_read_their_per_token_field(single_rank):
    """The two flows train different losses (the field is used), and the loss moves."""
    weighted, per_sample = single_rank["test_token_weights"], single_rank["gpt_sft_per_sample"]
    assert len(set(weighted["losses"])) == NUM_STEPS
    assert abs(weighted["losses"][0] - per_sample["losses"][0]) > 1e-3


def test_pp2_dynamic_cp_equals_single_rank(single_rank):
    ranks = run_distributed(facade_steps, 4, args=(PP2_DYNAMIC_CP, FLOWS), timeout_s=240)
    for rank, result in enumerate(ranks):
        for flow in FLOWS:
            got, want = result[flow], single_rank[flow]
            where = f"rank {rank} {flow}"
            assert _close(got["evaluated"], want["evaluated"]), (where, got, want)
            for key in ("losses", "grad_norms"):
                for step, (a, b) in enumerate(zip(got[key], want[key], strict=True), start=1):
                    assert _close(a, b), f"{where} {key} step {step}: {a!r} vs {b!r}"
