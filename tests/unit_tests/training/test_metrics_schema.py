"""Both entry points write ONE JSONL schema: pretrain_gpt.py (--log-metrics-jsonl) and
MegatronWrap (the ``jsonl`` metric writer) produce records with the same keys, for the same
tiny packed run on one rank."""

import json

from megatron.training.arguments import build_parser
from megatron.wrap import MegatronWrap
from megatron.wrap.config import build_config
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import tiny_packed_config, train_on_this_rank

STEPS = 2
CONFIG = tiny_packed_config(global_batch_size=2, train_iters=STEPS)


def _both_entry_points(tmp: str) -> dict:
    pretrain_path, facade_path = f"{tmp}/pretrain.jsonl", f"{tmp}/facade.jsonl"
    argv = build_config(CONFIG).to_argv(build_parser())
    train_on_this_rank(argv + ["--log-metrics-jsonl", pretrain_path])
    logging = {"metric_writers": ["jsonl"], "metrics_jsonl_path": facade_path,
               "progress_bar": False}
    batch = [{"input_ids": list(range(1, n + 1))} for n in (5, 9)]
    with MegatronWrap({**CONFIG, "logging": logging}) as wrap:
        wrap.initialize().setup_model_and_optimizer()
        for _ in range(STEPS):
            wrap.train(batch)
            wrap.log_last_metrics()
    read = lambda path: [json.loads(line) for line in open(path, encoding="utf-8")]  # noqa
    return {"pretrain": read(pretrain_path), "facade": read(facade_path)}


def test_pretrain_and_facade_write_the_same_jsonl_keys(tmp_path):
    (result,) = run_distributed(_both_entry_points, 1, args=(str(tmp_path),), timeout_s=180)
    pretrain, facade = result["pretrain"], result["facade"]
    assert [r["iteration"] for r in pretrain] == [r["iteration"] for r in facade] == [1, 2]
    for ours, theirs in zip(pretrain, facade):
        assert list(ours) == list(theirs), (sorted(set(ours) ^ set(theirs)))
    assert {"lm_loss", "grad_norm", "lr", "consumed_samples", "tokens_per_s"} <= set(pretrain[0])
