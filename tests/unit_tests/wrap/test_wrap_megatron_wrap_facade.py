"""megatron-wrap's call sequence on 2 gloo ranks with a config in its format: its
example script's flow of calls, its metric keys, its parallel-state
accessors, micro_batch_size honoured as a packing budget (same losses), the prompt of its SFT
samples masked (the loss of the hand-masked data-path sample, not of the unmasked one)."""

import math

import pytest

from megatron.wrap import MegatronWrap
from tests.harness.multirank import run_distributed
from tests.unit_tests.wrap.megatron_wrap_format import write_nest

STEPS = 2
SFT_BATCH = [  # megatron-wrap's SFT form: the first context_token_length ids are the prompt
    {"input_ids": [3, 17, 5, 9, 44, 12, 7, 30, 2], "context_token_length": 4},
    {"input_ids": [8, 1, 60, 22, 13, 5], "context_token_length": 2},
    {"input_ids": [70, 4, 4, 19, 23, 11, 90, 6, 52, 33, 10], "context_token_length": 7},
    {"input_ids": [15, 26, 37, 48], "context_token_length": 1},
]


def _hand_masked(sample: dict) -> dict:
    """The same sample in the data-path form, its loss mask written out by hand."""
    ids, prompt = sample["input_ids"], sample["context_token_length"]
    return {"tokens": ids[:-1], "labels": ids[1:],
            "loss_mask": [int(j + 1 >= prompt) for j in range(len(ids) - 1)]}


def rank_example_flow(view: str, overrides: list[str]) -> dict:
    """megatron-wrap's example.py, call for call, with SFT batches."""
    wrap = MegatronWrap(view, overrides=overrides)
    flow_key = wrap.get_flow_key()
    common = wrap.get_common_args()
    wrap.initialize()
    wrap.setup_model_and_optimizer()
    states = wrap.get_parallel_states()
    out = {"flow_key": flow_key, "train_iters": common.train_iters,
           "global_batch_size": common.global_batch_size,
           "budget": wrap.run.packing.max_seqlen_per_dp_cp_rank,
           "states": sorted(vars(states)), "dp_rank": states.dp_rank,
           "formatted": wrap.format_parallel_states(), "metrics": [], "saved": None}
    out["eval_wrap_form"] = wrap.evaluate(SFT_BATCH)["loss"]
    out["eval_hand_masked"] = wrap.evaluate([_hand_masked(s) for s in SFT_BATCH])["loss"]
    out["eval_unmasked"] = wrap.evaluate([{"input_ids": s["input_ids"]}
                                          for s in SFT_BATCH])["loss"]
    for _ in range(STEPS):
        out["metrics"].append(wrap.train(SFT_BATCH))
        wrap.log_last_metrics()
    out["saved"] = wrap.save()
    wrap.close()
    return out


def _run(tmp_path, overrides=()):
    view = write_nest(tmp_path)
    base = [f"megatron_lm.train.common.save={tmp_path / 'ckpt'}"]
    return run_distributed(rank_example_flow, 2, args=(str(view), base + list(overrides)),
                           timeout_s=240)


@pytest.fixture(scope="module")
def two_rank_runs(tmp_path_factory):
    """The view's micro_batch_size 2, and the same run with micro_batch_size 1."""
    return (_run(tmp_path_factory.mktemp("mbs2")),
            _run(tmp_path_factory.mktemp("mbs1"), ["megatron_lm.train.common.micro_batch_size=1"]))


def test_example_call_sequence_and_accessors(two_rank_runs):
    results = two_rank_runs[0]
    for rank, out in enumerate(results):
        assert out["flow_key"] == "gpt_sft"
        assert (out["train_iters"], out["global_batch_size"]) == (3, 4)
        assert out["states"] == sorted(f"{a}_{w}" for a in ("tp", "pp", "dp", "cp", "ep")
                                       for w in ("size", "rank", "group"))
        assert out["formatted"] == f"(TP0/1 PP0/1 DP{rank}/2 CP0/1 EP0/1)"
        assert out["saved"].endswith("iter_0000002")


def test_context_token_length_is_the_hand_masked_loss(two_rank_runs):
    out = two_rank_runs[0][0]
    assert out["eval_wrap_form"] == pytest.approx(out["eval_hand_masked"], rel=1e-6)
    assert abs(out["eval_wrap_form"] - out["eval_unmasked"]) > 1e-3  # the prompt is not trained


def test_megatron_wrap_metric_keys(two_rank_runs):
    for step, metrics in enumerate(two_rank_runs[0][0]["metrics"], start=1):
        assert metrics["learning_rate"] == metrics["lr"] == pytest.approx(1e-3)
        assert metrics["consumed_samples"] == 4 * step
        assert metrics["elapsed_time"] == metrics["step_time_s"] > 0
        # throughput: TFLOP/s per device from the step's TFLOPs, time and world size
        assert metrics["throughput"] == pytest.approx(
            metrics["tflops"] / (metrics["elapsed_time"] * 2), rel=1e-9)
        assert metrics["tflops"] > 0 and metrics["max_memory_rss"] > 0


def test_micro_batch_size_is_a_packing_budget_with_the_same_losses(two_rank_runs):
    mbs2, mbs1 = two_rank_runs
    assert mbs2[0]["budget"] == 2 * mbs1[0]["budget"] == 2 * 32
    for a, b in zip(mbs2[0]["metrics"], mbs1[0]["metrics"]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
        assert math.isfinite(a["loss"])
    assert mbs2[0]["metrics"][0]["num_microbatches"] <= mbs1[0]["metrics"][0]["num_microbatches"]
