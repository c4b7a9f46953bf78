"""Smoke test: each example's ``main`` trains 2 steps on 2 gloo ranks (tiny sizes)."""

import importlib.util
import math
from pathlib import Path

from tests.harness.multirank import run_distributed

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "wrap"
TINY = ["model.hidden_size=32", "model.ffn_hidden_size=64", "model.seq_length=64",
        "model.max_position_embeddings=64", "parallel.max_seqlen_per_dp_cp_rank=64"]
STEPS = 2


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"wrap_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _argv() -> list[str]:
    return ["--steps", str(STEPS), *(arg for item in TINY for arg in ("--override", item))]


def rank_examples() -> dict:
    sft = _load("sft_jsonl").main(_argv() + ["--override", "training.global_batch_size=4"])
    rl = _load("rl_runtime_loop").main(_argv())
    return {"sft": sft, "rl": rl}


def test_examples_train_on_two_ranks():
    results = run_distributed(rank_examples, 2, timeout_s=180)
    for name in ("sft", "rl"):
        losses = [[m["loss"] for m in r[name]] for r in results]
        assert losses[0] == losses[1], f"{name}: ranks report different losses {losses}"
        assert all(math.isfinite(loss) for loss in losses[0]), losses
        assert [m["iteration"] for m in results[0][name]] == list(range(1, STEPS + 1))
    assert "nll" in results[0]["rl"][0], "the example's own flow reports its metric"
