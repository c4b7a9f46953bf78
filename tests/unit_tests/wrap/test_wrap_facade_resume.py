"""Facade checkpoints, user flows and bad input, on 2 gloo ranks.

- save -> fresh facade -> load -> train continues identically (PP=2), and the iteration in the
  checkpoint path is the one ``log_last_metrics()`` printed;
- a user flow registered by name is used, and its extra metric is reduced like the loss;
- bad batches raise the same one-line ValueError on every rank, with the batch on every rank
  or on rank 0 only, and training goes on afterwards (no rank left behind in a collective).
"""

import contextlib
import io
import os
import re

import torch

from megatron.wrap import MegatronWrap, MockFlow, register_flow
from megatron.wrap.flows.base import LOSS_KEY
from tests.harness.multirank import run_distributed

WORLD = 2
LENGTHS = {"mode": "distribution", "type": "lognormal", "min_seq_len": 4, "max_seq_len": 64,
           "mean_seq_len": 24, "lognormal_sigma": 1.0}
BASE = {
    "model": {"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 64,
              "vocab_size": 128, "make_vocab_size_divisible_by": 32, "hidden_dropout": 0.0,
              "attention_dropout": 0.0},
    "training": {"micro_batch_size": 1, "global_batch_size": 4, "train_iters": 3,
                 "lr": 2e-3, "lr_warmup_iters": 1, "seed": 5, "eval_iters": 0},
    "data": {"mock_data": True, "sft": True, "sft_mock_dataset_config_json": LENGTHS,
             "tokenizer_type": "NullTokenizer"},
    "logging": {"metric_writers": ["console"], "progress_bar": False},
}
# pretrain_gpt's line, after Megatron-LM's timestamp
STEP_LINE = re.compile(r"INFO  \[[^\]]+\] iteration +(\d+)/ +\d+ \| consumed samples: ")


@register_flow("test_mock_nll", replace=True)
class MockNLLFlow(MockFlow):
    """The mock flow plus an ``nll`` metric computed like the loss (must report the same)."""

    metric_names = (LOSS_KEY, "nll")

    def loss(self, output, loss_inputs):
        loss_sum, num_tokens, metrics = super().loss(output, loss_inputs)
        return loss_sum, num_tokens, {**metrics, "nll": metrics[LOSS_KEY].clone()}


def _config(**sections) -> dict:
    config = {key: dict(value) for key, value in BASE.items()}
    for section, values in sections.items():
        config.setdefault(section, {}).update(values)
    return config


def _train(wrap, steps) -> list[dict]:
    return [wrap.train(wrap.flow.make_batch(step)) for step in steps]


def rank_resume(save_dir: str) -> dict:
    config = _config(parallel={"pipeline_model_parallel_size": 2},
                     flow={"flow_name": "test_mock_nll"}, checkpoint={"save": save_dir})
    with MegatronWrap(config) as wrap:
        straight = _train(wrap.initialize().setup_model_and_optimizer(), range(3))
    with MegatronWrap(config) as wrap:
        first = _train(wrap.initialize().setup_model_and_optimizer(), range(1))
        log = io.StringIO()
        with contextlib.redirect_stdout(log):
            wrap.log_last_metrics()
        path = wrap.save()
    with MegatronWrap(config) as wrap:
        loaded = wrap.initialize().setup_model_and_optimizer().load(path)
        resumed = _train(wrap, range(loaded, 3))
    return {"straight": straight, "first": first, "resumed": resumed, "path": path,
            "log": log.getvalue(), "loaded": loaded}


def test_save_load_continues_identically(tmp_path):
    results = run_distributed(rank_resume, WORLD, args=(str(tmp_path),), timeout_s=240)
    for rank, r in enumerate(results):
        straight = [m["loss"] for m in r["straight"]]
        assert len(set(straight)) == 3, straight
        assert [m["loss"] for m in r["first"] + r["resumed"]] == straight, f"rank {rank}"
        assert r["loaded"] == r["first"][-1]["iteration"] == 1
        for m in r["straight"]:  # the user flow's metric, reduced and broadcast like the loss
            assert abs(m["nll"] - m["loss"]) <= 1e-6 * abs(m["loss"]), m
    assert os.path.basename(results[0]["path"]) == "iter_0000001"
    logged = [STEP_LINE.search(r["log"]) for r in results]
    assert logged[0] is None and logged[-1] is not None, "metrics are written by the last rank"
    assert int(logged[-1].group(1)) == 1


BAD_BATCHES = {  # name: (batch, part of the message)
    "empty": ([], "empty batch: train() needs a non-empty list of samples (got 0)"),
    "none": (None, "empty batch"),
    "not a list": ({"input_ids": [1, 2]}, "train() takes a list of samples (dicts), got dict"),
    "not a dict": ([{"input_ids": [1, 2]}, "hello"],
                   "sample 1: expected a dict of fields, got str"),
    "too long": ([{"input_ids": [1, 2]}, {"input_ids": list(range(70))}],
                 "sample 1, field 'tokens': length 69 exceeds the limit 64 of this run (config "
                 "key 'seq_length')"),
    "float id": ([{"input_ids": [1, 2.5, 3]}],
                 "sample 0, field 'input_ids': expected a list of ints or a 1-D integer tensor, "
                 "but item 1 is float 2.5"),
    "id >= vocab": ([{"prompt_ids": [1, 2], "response_ids": [3, 300]}],
                    "sample 0, field 'response_ids': id 300 at position 1 is outside [0, 128)"),
    "2-D tensor": ([{"tokens": torch.zeros(2, 3, dtype=torch.long), "labels": [1, 2, 3]}],
                   "sample 0, field 'tokens': expected a list of ints or a 1-D integer tensor, "
                   "got a 2-D torch.int64 tensor"),
    "short labels": ([{"tokens": [1, 2, 3], "labels": [2, 3]}],
                     "sample 0, field 'labels': has 2 entries but the sample has 3 tokens"),
    "long labels": ([{"tokens": [1, 2, 3], "labels": [2, 3, 4, 5]}],
                    "sample 0, field 'labels': has 4 entries but the sample has 3 tokens; give "
                    "exactly one entry per token"),
    "long loss_mask": ([{"tokens": [1, 2], "labels": [2, 3], "loss_mask": [1, 1, 0]}],
                       "sample 0, field 'loss_mask': has 3 entries but the sample has 2 tokens"),
    "nan mask": ([{"tokens": [1, 2], "labels": [2, 3], "loss_mask": [1.0, float("nan")]}],
                 "sample 0, field 'loss_mask': value nan at position 1 is not finite"),
    "no form": ([{"text": "hi"}], "sample 0: has fields 'text'; flow 'gpt_sft' reads one of"),
}


def rank_bad_input() -> dict:
    config = _config(parallel={"context_parallel_size": 2},
                     flow={"flow_args": {"truncate": False}})
    messages = {}
    with MegatronWrap(config) as wrap:
        wrap.initialize().setup_model_and_optimizer()
        for source in ("all_ranks", "rank0"):
            for name, (batch, _) in BAD_BATCHES.items():
                given = batch if source == "all_ranks" or wrap.rank == 0 else None
                try:
                    wrap.train(given, source=source)
                except ValueError as err:
                    messages[f"{source}/{name}"] = str(err)
        good = wrap.train([{"input_ids": list(range(1, 20))}, {"input_ids": [5, 6, 7]}])
    return {"messages": messages, "good": good}


def test_bad_input_is_one_line_on_every_rank():
    results = run_distributed(rank_bad_input, WORLD, timeout_s=120)
    assert results[0]["messages"] == results[1]["messages"], "ranks disagree"
    messages = results[0]["messages"]
    for source in ("all_ranks", "rank0"):
        for name, (_, expected) in BAD_BATCHES.items():
            key = f"{source}/{name}"
            assert key in messages, f"{key}: no ValueError"
            assert expected in messages[key], f"{key}: {messages[key]!r}"
            assert "\n" not in messages[key]
    assert all(r["good"]["iteration"] == 1 and r["good"]["loss"] > 0 for r in results)
