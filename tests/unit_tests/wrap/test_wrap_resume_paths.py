"""A facade resume (``MegatronWrap.load`` -> ``Trainer.load``) and ``pretrain_gpt.py``'s start-up
resume (``--load``: ``training.setup_model_and_optimizer``) restore the same run, on one rank.

- The same optimizer: torch's fused Adam wherever the start-up path picks it, also for a
  checkpoint saved without it (by a CPU run, or before fused Adam). CPU runs keep torch's
  default kernel, so the test adds "cpu" to ``optimizer_kernels.FUSED_ADAM_DEVICE_TYPES``
  (torch has a fused CPU kernel) after the save, as a GPU run resuming a CPU checkpoint would
  see it. Reference: the flags of the start-up path's param groups, and its next step.
- The same data positions: ``evaluate()`` counts the validation samples it read
  (Megatron-LM's ``consumed_valid_samples``); reference: the sum of the batch sizes, in the
  checkpoint's run_args.json and in both resumed states.
- A checkpoint written by one entry point continues in the other: pretrain_gpt.py saves
  iteration 1 and the facade trains global batches 2 and 3 from it; the facade saves
  iteration 1 and pretrain_gpt.py --load trains iterations 2 and 3. Reference: pretrain_gpt.py's
  three iterations without a break (loss, grad norm, LR, consumed samples).
"""

import json
import os

from megatron.varlen_training import optimizer_kernels
from megatron.varlen_training.arguments import build_parser
from megatron.varlen_training.resume.run_args_keys import RUN_ARGS_FILENAME, VALID_POSITION_KEY
from megatron.wrap import MegatronWrap
from megatron.wrap.config import build_config
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import train_on_this_rank
from tests.unit_tests.wrap import test_wrap_facade_trajectory as trajectory
from tests.unit_tests.wrap.test_wrap_runtime_batch_sizes import CONFIG, _batch

EVAL_SIZES = (3, 2)  # samples of the two evaluate() calls before the save


def _adam_flags(wrap) -> list[tuple]:
    return [(group["fused"], group["foreach"])
            for inner in optimizer_kernels.torch_adam_optimizers(wrap.state.optimizer)
            for group in inner.param_groups]


def _resumed(config: dict, load_path: str | None) -> dict:
    """A fresh facade resumed from the checkpoint: through load() (``load_path``) or through
    the config's ``load`` at set-up (None); its optimizer, positions and next step."""
    with MegatronWrap(config) as wrap:
        wrap.initialize().setup_model_and_optimizer()
        if load_path is not None:
            wrap.load(load_path)
        state = wrap.state
        resumed = {"adam": _adam_flags(wrap), "valid": state.consumed_valid_samples,
                   "train": state.consumed_train_samples, "iteration": state.iteration}
        step = wrap.train(_batch(1, 4))
        return {**resumed, "loss": step["loss"], "grad_norm": step["grad_norm"]}


def rank_resume_paths(save_dir: str) -> dict:
    config = {**CONFIG, "checkpoint": {"save": save_dir}}
    with MegatronWrap(config) as wrap:
        wrap.initialize().setup_model_and_optimizer()
        saved_adam = _adam_flags(wrap)
        wrap.train(_batch(0, 3))
        for size in EVAL_SIZES:
            wrap.evaluate(_batch(5, size))
        path = wrap.save()
    optimizer_kernels.FUSED_ADAM_DEVICE_TYPES = ("cuda", "cpu")  # a GPU run resuming it
    return {"saved_adam": saved_adam, "path": path,
            "facade": _resumed(config, path),
            "start_up": _resumed({**config, "checkpoint": {"save": save_dir, "load": save_dir}},
                                 None)}


def test_facade_load_and_start_up_load_restore_the_same_run(tmp_path):
    got = run_distributed(rank_resume_paths, 1, args=(str(tmp_path),), timeout_s=240)[0]
    assert got["saved_adam"] == [(None, None)] * len(got["saved_adam"])  # CPU: torch's default
    facade, start_up = got["facade"], got["start_up"]
    assert start_up["adam"] == [(True, False)] * len(start_up["adam"])
    assert facade["adam"] == start_up["adam"]
    with open(os.path.join(got["path"], RUN_ARGS_FILENAME)) as handle:
        recorded = json.load(handle)[VALID_POSITION_KEY]
    assert recorded == facade["valid"] == start_up["valid"] == sum(EVAL_SIZES)
    assert facade["train"] == start_up["train"] == 3 and facade["iteration"] == 1
    assert facade["loss"] == start_up["loss"] and facade["grad_norm"] == start_up["grad_norm"]


def _pretrain_steps(argv: list[str]) -> list[tuple]:
    return [(h["lm_loss"], h["grad_norm"]) for h in train_on_this_rank(argv)["history"]]


def rank_across_entry_points(tmp: str) -> dict:
    config = trajectory._config({})
    argv = build_config(config).to_argv(build_parser())
    straight = train_on_this_rank(argv + ["--log-metrics-jsonl", f"{tmp}/straight.jsonl"])
    batches = trajectory._dataset_batches(argv)  # global batch s: pretrain_gpt.py's iteration s+1
    train_on_this_rank(argv + ["--save", f"{tmp}/by_pretrain", "--exit-interval", "1"])
    with MegatronWrap({**config, "checkpoint": {"load": f"{tmp}/by_pretrain"}}) as wrap:
        wrap.initialize().setup_model_and_optimizer()
        facade = [wrap.train(batch) for batch in batches[1:]]
    with MegatronWrap(config) as wrap:
        wrap.initialize().setup_model_and_optimizer()
        wrap.train(batches[0])
        wrap.save(f"{tmp}/by_facade")
    with open(f"{tmp}/straight.jsonl", encoding="utf-8") as handle:
        records = [json.loads(line) for line in handle]
    return {"straight": [(h["lm_loss"], h["grad_norm"]) for h in straight["history"]],
            "straight_lr": [(r["lr"], r["consumed_samples"]) for r in records],
            "facade": [(m["loss"], m["grad_norm"]) for m in facade],
            "facade_lr": [(m["lr"], m["consumed_samples"]) for m in facade],
            "pretrain": _pretrain_steps(argv + ["--load", f"{tmp}/by_facade"])}


def _close(got: list[tuple], want: list[tuple]) -> bool:
    return len(got) == len(want) and all(
        abs(a - b) <= trajectory.RTOL * abs(b) for pair, ref in zip(got, want)
        for a, b in zip(pair, ref))


def test_a_checkpoint_continues_in_the_other_entry_point(tmp_path):
    got = run_distributed(rank_across_entry_points, 1, args=(str(tmp_path),), timeout_s=300)[0]
    straight = got["straight"]
    assert len(set(straight)) == trajectory.NUM_STEPS  # the loss moves: a real comparison
    assert _close(got["facade"], straight[1:]), (got["facade"], straight)
    assert got["facade_lr"] == got["straight_lr"][1:]
    assert _close(got["pretrain"], straight[1:]), (got["pretrain"], straight)
