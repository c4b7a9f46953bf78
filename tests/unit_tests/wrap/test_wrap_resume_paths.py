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
"""

import json
import os

from megatron.varlen_training import optimizer_kernels
from megatron.varlen_training.resume_consistency import RUN_ARGS_FILENAME, VALID_POSITION_KEY
from megatron.wrap import MegatronWrap
from tests.harness.multirank import run_distributed
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
