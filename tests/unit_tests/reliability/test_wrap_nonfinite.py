"""The non-finite guard (no step applied, every rank stopping) in megatron.wrap on 2 gloo
ranks (DP2, distributed optimizer).

1. A NaN/Inf step (per-token advantages of 1e38: the policy-gradient loss overflows) raises
   NonFiniteLossError on every rank BEFORE the optimizer applies it: weights, Adam state, LR
   schedule and iteration are unchanged, so a save() afterwards writes the last good state
   under the same iteration (the previous checkpoint stays the latest, never NaN weights), and
   training goes on from it exactly as a fresh facade loading that checkpoint does.
3. A per-token field longer than the sample (advantages) is a one-line ValueError on every
   rank, never silently cut to length.
"""

import math

import torch

from megatron.varlen_training.checkpoint import TRACKER_FILENAME
from megatron.varlen_training.errors import NonFiniteLossError
from megatron.wrap import GPTSFTFlow, MegatronWrap, register_flow
from tests.harness.multirank import run_distributed
from tests.unit_tests.reliability.test_nan_guard import changed_parts, snapshot_training_state

WORLD = 2
HUGE_ADVANTAGE = 1e38  # finite in float32 (accepted), but the loss sum overflows to Inf
LOSS_KEY = "lm loss"


@register_flow("test_advantages", replace=True)
class AdvantageFlow(GPTSFTFlow):
    """REINFORCE-style: the loss is sum(advantage * -log p(label)) over trained tokens."""

    def fields_and_seq_dims(self):
        return {**super().fields_and_seq_dims(), "advantages": 0}

    def collate_micro_batch(self, micro_batch):
        model_inputs, loss_inputs = super().collate_micro_batch(micro_batch)
        return model_inputs, {**loss_inputs, "advantages": micro_batch["advantages"]}

    def loss(self, output, loss_inputs):
        mask = loss_inputs["loss_mask"].float().reshape(-1)
        weights = loss_inputs["advantages"].float().reshape(-1) * mask
        loss_sum, count = (output.float().reshape(-1) * weights).sum(), mask.sum()
        return loss_sum, count.to(torch.int), {LOSS_KEY: torch.stack([loss_sum.detach(), count])}


def _config(save_dir: str) -> dict:
    return {
        "model": {"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
                  "seq_length": 32, "vocab_size": 64, "make_vocab_size_divisible_by": 16,
                  "hidden_dropout": 0.0, "attention_dropout": 0.0},
        "training": {"micro_batch_size": 1, "global_batch_size": 4, "train_iters": 10,
                     "lr": 1e-3, "seed": 5, "eval_iters": 0},
        "optimizer": {"use_distributed_optimizer": True},
        "data": {"tokenizer_type": "NullTokenizer"},
        "checkpoint": {"save": save_dir},
        "flow": {"flow_name": "test_advantages"},
        "logging": {"metric_writers": [], "progress_bar": False},
    }


def _batch(advantage: float, extra_entries: int = 0) -> list[dict]:
    """4 samples of 5..8 tokens (documents of n ids are n - 1 tokens)."""
    batch = []
    for n in (6, 7, 8, 9):
        ids = [(3 * i + n) % 60 + 1 for i in range(n)]
        batch.append({"input_ids": ids, "advantages": [advantage] * (n - 1 + extra_entries)})
    return batch


def rank_nan_step(save_dir: str) -> dict:
    out = {}
    with MegatronWrap(_config(save_dir)) as wrap:
        wrap.initialize().setup_model_and_optimizer()
        wrap.train(_batch(1.0))
        out["first save"] = wrap.save()
        try:
            wrap.train(_batch(1.0, extra_entries=1))
        except ValueError as err:
            out["too long"] = str(err)
        before = snapshot_training_state(wrap.state)
        try:
            wrap.train(_batch(HUGE_ADVANTAGE))
        except NonFiniteLossError as err:
            out["error"] = str(err)
        out["changed"] = changed_parts(before, snapshot_training_state(wrap.state))
        out["second save"] = wrap.save()
        out["iteration"] = wrap.iteration
        out["continued"] = wrap.train(_batch(-0.5))["loss"]
    with MegatronWrap(_config(save_dir)) as fresh:
        out["loaded"] = fresh.initialize().setup_model_and_optimizer().load()
        loaded = snapshot_training_state(fresh.state)
        out["loaded differs"] = changed_parts(before, loaded)
        out["loaded finite"] = all(bool(torch.isfinite(w).all()) for w in loaded["weights"])
        out["resumed"] = fresh.train(_batch(-0.5))["loss"]
    return out


def test_nan_step_keeps_the_last_good_state_and_checkpoint(tmp_path):
    results = run_distributed(rank_nan_step, WORLD, args=(str(tmp_path),), timeout_s=240)
    for rank, r in enumerate(results):
        assert r.get("error", "").startswith("iteration 2: lm loss and grad norm are NaN/Inf; "
                                             "the step was not applied"), (rank, r)
        assert r["changed"] == [], f"rank {rank}: the NaN step changed {r['changed']}"
        assert r["iteration"] == 1 and r["second save"] == r["first save"], (rank, r)
        assert r["loaded"] == 1 and r["loaded differs"] == [] and r["loaded finite"], (rank, r)
        # Training goes on from the last good state exactly as from its checkpoint.
        assert math.isfinite(r["continued"]) and r["continued"] == r["resumed"], (rank, r)
    assert (tmp_path / TRACKER_FILENAME).read_text() == "1"
    assert sorted(p.name for p in tmp_path.glob("iter_*")) == ["iter_0000001"]
    assert results[0]["too long"] == results[1]["too long"] == (
        "sample 0, field 'advantages': has 6 entries but the sample has 5 tokens; give exactly "
        "one entry per token")
