"""Parquet SFT == JSONL SFT on the same conversations: a short packed training run on each form
(one .parquet file, a folder of shards, a datasets.save_to_disk folder) gives the JSONL run's
losses and grad norms, iteration by iteration (the same samples make the same batches, so the
numbers are identical, not merely close). Two DP ranks, packed, ByteLevelTokenizer. At the end
each Parquet/Arrow run counts its truncated rows over both ranks, once
(truncation_report.py; the counting itself: test_sft_arrow_counts.py)."""

import pytest

from tests.harness.extras import needs_extra
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import loss_owner_history, train_on_this_rank
from tests.unit_tests.varlen_training.datasets.sft_files import conversations, write_all_forms

pytestmark = needs_extra("data")

NUM_ITERS = 4
ARGS = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "64", "--micro-batch-size", "1", "--global-batch-size", "8",
        "--train-iters", str(NUM_ITERS), "--lr", "2e-3", "--sft", "--tokenizer-type",
        "ByteLevelTokenizer", "--hidden-dropout", "0", "--attention-dropout", "0",
        "--position-embedding-type", "rope", "--log-interval", "1", "--eval-iters", "1",
        "--eval-interval", "2", "--seed", "5", "--sequence-packing"]


def _train_with_cache(argv: list[str], cache: str) -> dict:
    """train_on_this_rank with datasets' Arrow cache in the test's folder; adds the merged
    truncation counts the run reported (None: it gathered none)."""
    import datasets

    from megatron.varlen_training.datasets import truncation_report

    datasets.config.HF_DATASETS_CACHE = cache
    reported, gather = [], truncation_report.gather_truncated_rows

    def recording(local):
        reported.append(gather(local))
        return reported[-1]

    truncation_report.gather_truncated_rows = recording
    try:
        return {**train_on_this_rank(argv), "truncated": reported or None}
    finally:
        truncation_report.gather_truncated_rows = gather


def _history(data_path: str, cache: str) -> dict:
    results = run_distributed(_train_with_cache, 2,
                              args=(ARGS + ["--data-path", data_path], cache), timeout_s=300)
    return {"history": loss_owner_history(results),
            "truncated": [result["truncated"] for result in results]}


@pytest.fixture(scope="module")
def histories(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft_forms")
    forms = write_all_forms(conversations(48, seed=1), root)
    runs = {form: _history(path, str(root / "hf_cache")) for form, path in forms.items()}
    return {form: run["history"] for form, run in runs.items()} | {
        f"{form}_truncated": run["truncated"] for form, run in runs.items()}


@pytest.mark.parametrize("form", ["parquet", "shards", "save_to_disk"])
def test_parquet_and_arrow_train_like_jsonl(histories, form):
    assert len(histories["jsonl"]) == NUM_ITERS
    assert histories[form] == histories["jsonl"]


def test_the_runs_learn_and_validate(histories):
    losses = [h["lm_loss"] for h in histories["jsonl"]]
    assert len(set(losses)) == NUM_ITERS  # a frozen run would compare trivially
    assert histories["jsonl"][1]["validation_loss"] is not None


@pytest.mark.parametrize("form", ["parquet", "shards", "save_to_disk"])
def test_truncations_are_reported_once_over_both_ranks(histories, form):
    """The end of a Parquet/Arrow run gathers both ranks' truncated rows once, the same
    report on each (some conversations are longer than --seq-length 64); JSONL, counted at
    start-up, gathers nothing."""
    assert histories["jsonl_truncated"] == [None, None]
    (on_rank_0,), (on_rank_1,) = histories[f"{form}_truncated"]
    assert on_rank_0 == on_rank_1
    (rows,) = on_rank_0.values()
    assert rows and all(cut > 0 for cut in rows.values())
