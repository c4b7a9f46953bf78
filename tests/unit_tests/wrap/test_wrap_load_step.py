"""``MegatronWrap.load`` of an iteration other than the latest, on one rank: as
``pretrain_gpt.py --load ROOT --ckpt-step N`` does.

A run saves iterations 1 and 2 (2 is the latest). A fresh facade that loads iteration 1, given
as its ``iter_0000001`` folder or as the root with ``step=1``, trains global batches 1 and 2
with the losses of the straight run (three steps, no save), and so does a facade configured
with no model keys, ``load``, ``ckpt_step: 1`` and ``use_checkpoint_args``; a ``step`` that
disagrees with the ``iter_*`` folder given, or one not saved, is one line.
"""

import pytest

from megatron.varlen_training.errors import CheckpointError
from megatron.wrap import MegatronWrap
from megatron.wrap.config import ConfigError
from tests.harness.multirank import run_distributed
from tests.unit_tests.wrap.test_wrap_facade_resume import _config, _train

NUM_STEPS = 3


def _resumed_losses(config: dict, path: str, step: int | None) -> dict:
    with MegatronWrap(config) as wrap:
        loaded = wrap.initialize().setup_model_and_optimizer().load(path, step=step)
        return {"loaded": loaded, "losses": [m["loss"] for m in _train(wrap, range(loaded,
                                                                                     NUM_STEPS))]}


def _refusal(config: dict, path: str, step: int | None) -> str:
    with MegatronWrap(config) as wrap:
        wrap.initialize().setup_model_and_optimizer()
        try:
            wrap.load(path, step=step)
        except (ConfigError, CheckpointError) as err:
            return str(err)
    return "loaded"


def _started_from(config: dict, save_dir: str) -> dict:
    """A facade with no model keys but the dropouts (not recorded), loading iteration 1 at
    set-up with ``use_checkpoint_args``: the model comes from the checkpoint."""
    model = {key: value for key, value in config["model"].items() if "dropout" in key}
    checkpoint = {"load": save_dir, "ckpt_step": 1, "use_checkpoint_args": True}
    with MegatronWrap({**config, "model": model, "checkpoint": checkpoint}) as wrap:
        wrap.initialize().setup_model_and_optimizer()
        loaded = wrap.state.iteration
        return {"loaded": loaded, "losses": [m["loss"] for m in _train(wrap, range(loaded,
                                                                                     NUM_STEPS))]}


def rank_load_step(save_dir: str) -> dict:
    config = _config(checkpoint={"save": save_dir}, flow={"flow_name": "mock"})
    with MegatronWrap(config) as wrap:
        straight = [m["loss"] for m in _train(wrap.initialize().setup_model_and_optimizer(),
                                              range(NUM_STEPS))]
    with MegatronWrap(config) as wrap:
        wrap.initialize().setup_model_and_optimizer()
        _train(wrap, range(1))
        first = wrap.save()
        _train(wrap, range(1, 2))
        latest = wrap.save()
    return {"straight": straight, "latest": latest,
            "checkpoint_args": _started_from(config, save_dir),
            "by_folder": _resumed_losses(config, first, None),
            "by_step": _resumed_losses(config, save_dir, 1),
            "disagree": _refusal(config, latest, 1),
            "not_saved": _refusal(config, save_dir, 5)}


@pytest.fixture(scope="module")
def got(tmp_path_factory) -> dict:
    save_dir = str(tmp_path_factory.mktemp("load_step"))
    return run_distributed(rank_load_step, 1, args=(save_dir,), timeout_s=240)[0]


@pytest.mark.parametrize("how", ["by_folder", "by_step", "checkpoint_args"])
def test_an_older_iteration_continues_as_the_straight_run(got, how):
    straight = got["straight"]
    assert len(set(straight)) == NUM_STEPS, straight  # the loss moves: a real comparison
    assert got["latest"].endswith("iter_0000002")
    assert got[how] == {"loaded": 1, "losses": straight[1:]}, (got[how], straight)


def test_a_step_other_than_the_folder_is_one_line(got):
    assert got["disagree"].endswith("is iteration 2; pass its root to load step 1, or drop "
                                    "step"), got["disagree"]


def test_a_step_not_saved_is_one_line(got):
    refusal = got["not_saved"]
    assert "holds no checkpoint of iteration 5 (it has 1, 2)" in refusal, refusal
    assert "\n" not in refusal
