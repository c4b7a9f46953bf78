"""One Trainer for both entry points: ``pretrain_gpt.py`` and ``MegatronWrap`` run the same
packed run through ``Trainer.step`` and write the same JSONL records through the same writer;
``pretrain_gpt.py``'s TensorBoard and wandb writers (``--tensorboard-dir``, ``--wandb-*``) get
the same numbers, wandb offline by ``$WANDB_MODE``.

tensorboard and wandb are optional packages (the ``[metrics]`` extra). One test injects
stand-in modules into ``sys.modules`` that record every call the writers make; where the real
packages are installed (scripts/setup_env.sh installs the extra), another runs them for real:
TensorBoard's event files read back with its own EventAccumulator, and an offline wandb run.
"""

import glob
import json
import os
import sys

import pytest
import torch

from megatron.varlen_training import trainer as trainer_module
from megatron.wrap import MegatronWrap
from megatron.wrap.config import build_config
from megatron.varlen_training.arguments import build_parser
from tests.harness.extras import needs_extra
from tests.harness.metric_fakes import fake_metric_modules
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import tiny_packed_config, train_on_this_rank

WORLD = 2
STEPS = 3
CONFIG = tiny_packed_config(global_batch_size=4, train_iters=STEPS)
# Wall-clock measurements differ between two runs of the same step; everything else is equal.
TIMING_KEYS = {"step_time_s", "tokens_per_s", "tflops_per_device"}


def _read_jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def _count_steps(counter: dict):
    """Wraps Trainer.step so that every call through it is counted under ``counter["n"]``."""
    real = trainer_module.Trainer.step

    def step(self, *args, **kwargs):
        counter["n"] += 1
        return real(self, *args, **kwargs)

    trainer_module.Trainer.step = step
    return real


def _pretrain(jsonl: str) -> int:
    counter = {"n": 0}
    real = _count_steps(counter)
    try:
        argv = build_config(CONFIG).to_argv(build_parser())
        train_on_this_rank(argv + ["--log-metrics-jsonl", jsonl])
    finally:
        trainer_module.Trainer.step = real
    return counter["n"]


def _facade(jsonl: str) -> int:
    """The same run fed through the facade: the mock flow yields pretrain_gpt.py's samples."""
    counter = {"n": 0}
    real = _count_steps(counter)
    logging = {"metric_writers": ["jsonl"], "metrics_jsonl_path": jsonl, "progress_bar": False}
    try:
        with MegatronWrap({**CONFIG, "flow": {"flow_name": "mock"}, "logging": logging}) as wrap:
            wrap.initialize().setup_model_and_optimizer()
            for step in range(STEPS):
                wrap.train(wrap.flow.make_batch(step))
                wrap.log_last_metrics()
    finally:
        trainer_module.Trainer.step = real
    return counter["n"]


def rank_both_entry_points(tmp: str) -> dict:
    ours, theirs = f"{tmp}/pretrain.jsonl", f"{tmp}/facade.jsonl"
    steps = {"pretrain": _pretrain(ours), "facade": _facade(theirs)}
    last = torch.distributed.get_rank() == WORLD - 1  # the rank that owns the writers
    records = {"pretrain": _read_jsonl(ours), "facade": _read_jsonl(theirs)} if last else None
    return {"steps": steps, "records": records}


def test_both_entry_points_write_the_same_records_through_one_trainer(tmp_path):
    results = run_distributed(rank_both_entry_points, WORLD, args=(str(tmp_path),),
                              timeout_s=300)
    assert all(r["steps"] == {"pretrain": STEPS, "facade": STEPS} for r in results), results
    assert results[0]["records"] is None
    ours, theirs = results[-1]["records"]["pretrain"], results[-1]["records"]["facade"]
    assert [r["iteration"] for r in ours] == [r["iteration"] for r in theirs] == [1, 2, 3]
    for mine, other in zip(ours, theirs):
        assert list(mine) == list(other)  # one schema, keys in one order
        same = {key: mine[key] for key in mine if key not in TIMING_KEYS}
        assert same == {key: other[key] for key in same}, (mine, other)
    assert len({r["lm_loss"] for r in ours}) == STEPS  # the loss moves: a real comparison


# --- TensorBoard and wandb from pretrain_gpt.py ---------------------------------------------


def rank_pretrain_gpt_with_writers(tmp: str) -> dict:
    import pretrain_gpt

    os.environ["WANDB_MODE"] = "offline"  # no network: wandb keeps the run on disk
    calls, runs = [], []
    sys.modules.update(fake_metric_modules(calls, runs))
    argv = build_config(CONFIG).to_argv(build_parser()) + [
        "--log-metrics-jsonl", f"{tmp}/metrics.jsonl", "--tensorboard-dir", f"{tmp}/tb",
        "--wandb-project", "varlen", "--wandb-exp-name", "tiny", "--wandb-save-dir",
        f"{tmp}/wandb"]
    pretrain_gpt.main(argv)  # the entry point itself (the harness's process group stays)
    if torch.distributed.get_rank() != WORLD - 1:
        return {"tensorboard": calls, "wandb": runs}
    run = runs[0]
    return {"tensorboard": calls, "wandb_init": run.init_kwargs,
            "wandb_logged": run.logged, "wandb_finished": run.finished,
            "records": _read_jsonl(f"{tmp}/metrics.jsonl")}


# Megatron-LM's training_log scalars (its names, its order) and the record keys holding them.
MEGATRON_LM_TENSORBOARD_KEYS = {"learning-rate": "lr", "batch-size": "global_batch_size",
                                "lm loss": "lm_loss", "loss-scale": "loss_scale",
                                "grad-norm": "grad_norm"}


def test_pretrain_gpt_writes_tensorboard_and_wandb_offline(tmp_path):
    results = run_distributed(rank_pretrain_gpt_with_writers, WORLD, args=(str(tmp_path),),
                              timeout_s=300)
    assert results[0] == {"tensorboard": [], "wandb": []}  # only the last rank writes
    last = results[-1]
    records = last["records"]
    numbers = [{key: value for key, value in record.items() if key != "iteration"
                and isinstance(value, (int, float))} for record in records]
    calls = last["tensorboard"]
    assert calls[0] == ("init", f"{tmp_path}/tb") and calls[-1] == ("close",)
    expected = []
    for record, values in zip(records, numbers):  # each record's keys, then Megatron-LM's
        iteration, samples = record["iteration"], record["consumed_samples"]
        expected += [(name, value, iteration) for name, value in values.items()]
        for name, key in MEGATRON_LM_TENSORBOARD_KEYS.items():
            expected += [(name, record[key], iteration),
                         (f"{name} vs samples", record[key], samples)]
    assert calls[1:-1] == expected
    init = last["wandb_init"]
    assert (init["project"], init["name"], init["dir"], init["mode"]) == (
        "varlen", "tiny", f"{tmp_path}/wandb", "offline")
    assert init["config"]["seq_length"] == 32 and init["config"]["wandb_project"] == "varlen"
    assert last["wandb_logged"] == [
        (record["iteration"], {**values, **{name: record[key] for name, key in
                                            MEGATRON_LM_TENSORBOARD_KEYS.items()},
                               "samples vs steps": record["consumed_samples"]})
        for record, values in zip(records, numbers)]
    assert last["wandb_finished"] and len(records) == STEPS


@pytest.mark.parametrize("extra, needle", [
    (["--tensorboard-dir", "tb"], "--tensorboard-dir needs the 'tensorboard' package"),
    (["--wandb-project", "p"], "--wandb-project needs the 'wandb' package"),
    (["--wandb-exp-name", "n"], "--wandb-exp-name 'n' needs --wandb-project"),
])
def test_writer_flags_are_checked_at_start_up(monkeypatch, extra, needle):
    from megatron.varlen_training.arguments import ArgumentValidationError, parse_args

    monkeypatch.setitem(sys.modules, "tensorboard", None)  # None: known not importable
    monkeypatch.setitem(sys.modules, "wandb", None)
    argv = build_config(CONFIG).to_argv(build_parser())
    with pytest.raises(ArgumentValidationError) as err:
        parse_args(argv + extra, world_size=1)
    assert needle in str(err.value) and "\n" not in str(err.value)


# --- the real packages ------------------------------------------------------------------------


def rank_pretrain_gpt_with_real_writers(tmp: str) -> dict:
    import pretrain_gpt

    os.environ["WANDB_MODE"] = "offline"
    argv = build_config(CONFIG).to_argv(build_parser()) + [
        "--log-metrics-jsonl", f"{tmp}/metrics.jsonl", "--tensorboard-dir", f"{tmp}/tb",
        "--wandb-project", "varlen", "--wandb-exp-name", "tiny", "--wandb-save-dir",
        f"{tmp}/wandb"]
    pretrain_gpt.main(argv)
    if torch.distributed.get_rank() != WORLD - 1:
        return {}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(f"{tmp}/tb")
    events.Reload()
    scalars = {tag: [(event.step, event.value) for event in events.Scalars(tag)]
               for tag in events.Tags()["scalars"]}
    runs = glob.glob(f"{tmp}/wandb/wandb/offline-run-*/run-*.wandb")
    return {"records": _read_jsonl(f"{tmp}/metrics.jsonl"), "scalars": scalars,
            "wandb_bytes": [os.path.getsize(path) for path in runs]}


@needs_extra("metrics")
def test_real_tensorboard_events_and_offline_wandb_run(tmp_path):
    last = run_distributed(rank_pretrain_gpt_with_real_writers, WORLD, args=(str(tmp_path),),
                           timeout_s=300)[-1]
    records, scalars = last["records"], last["scalars"]
    assert len(records) == STEPS and "lm_loss" in scalars, scalars.keys()
    for key in ("lm_loss", "grad_norm", "lr", "tokens_per_s"):  # each record's key, one tag
        got = scalars[key]
        expected = [(r["iteration"], r[key]) for r in records]
        assert [step for step, _ in got] == [step for step, _ in expected], key
        # TensorBoard stores float32.
        assert all(abs(g - e) <= 1e-6 * max(1.0, abs(e)) for (_, g), (_, e) in
                   zip(got, expected)), (key, got, expected)
    assert len(last["wandb_bytes"]) == 1 and last["wandb_bytes"][0] > 0, last["wandb_bytes"]
