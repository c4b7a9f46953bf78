"""``--decoupled-lr`` / ``--decoupled-min-lr`` (Megatron-LM's flags): the input embedding and the
output layer follow their own learning-rate schedule, the other weights the main one.

Reference: two megatron-core ``OptimizerParamScheduler``s built from the raw flag values, one
with ``--lr``/``--min-lr`` and one with the decoupled pair as its peak and final LR, stepped by
the samples of each step. A tiny GPT with untied embeddings trains a few real steps on one rank;
after each, every optimizer param group holding the embedding or output weight must carry the
decoupled scheduler's LR, every other group the main one's, and the logged learning rate is the
main one (Megatron-LM's ``get_canonical_lr_for_logging``).

Resume (plain and distributed optimizer): a checkpoint saved with the decoupled group resumes
(megatron-core 0.16.1 alone cannot tell that group from the main one when it loads them); with
--override-opt_param-scheduler the new --lr and --decoupled-lr are the ones the next step
applies (the loaded param groups would otherwise bring the old bounds back); turning it on or
off, or another value without a flag saying which side wins, is one line.
"""

import pytest
import torch

from tests.harness.multirank import run_distributed
from tests.harness.training_runs import TINY_GPT_ARGS, stepping_trainer

STEPS = 3
LR, MIN_LR, DECOUPLED_LR, DECOUPLED_MIN_LR = 1e-3, 1e-4, 5e-3, 2e-4
SCHEDULE = ["--train-iters", "4", "--lr-decay-style", "cosine", "--lr-warmup-iters", "1",
            "--lr", str(LR), "--min-lr", str(MIN_LR), "--untie-embeddings-and-output-weights"]
DECOUPLED = ["--decoupled-lr", str(DECOUPLED_LR), "--decoupled-min-lr", str(DECOUPLED_MIN_LR)]
GBS = 4  # TINY_GPT_ARGS' --global-batch-size


def _reference_lrs(max_lr: float, min_lr: float, steps: int = STEPS) -> list[float]:
    """megatron-core's scheduler with ``max_lr``/``min_lr``: the LR after each step."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)
    scheduler = OptimizerParamScheduler(
        optimizer, init_lr=0.0, max_lr=max_lr, min_lr=min_lr, lr_warmup_steps=1 * GBS,
        lr_decay_steps=4 * GBS, lr_decay_style="cosine", start_wd=0.01, end_wd=0.01,
        wd_incr_steps=4 * GBS, wd_incr_style="constant")
    lrs = []
    for _ in range(steps):
        scheduler.step(increment=GBS)
        lrs.append(optimizer.param_groups[0]["lr"])
    return lrs


def _model_params_by_group(optimizer) -> list[tuple[dict, list]]:
    """(param group, the model weights it updates): the distributed optimizer's groups hold
    shards of main params, its ``model_*_groups`` the model weights behind them."""
    pairs = []
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        groups = inner.optimizer.param_groups
        if hasattr(inner, "model_fp32_groups"):  # megatron-core's DistributedOptimizer
            pairs += [(group, inner.model_float16_groups[i] + inner.model_fp32_groups[i])
                      for i, group in enumerate(groups)]
        else:
            pairs += [(group, group["params"]) for group in groups]
    return pairs


def _group_lrs(state, iteration_report) -> dict:
    """The logged LR and, per param group, (lr, decoupled weights, other weights)."""
    decoupled_ids = {id(param) for chunk in state.model for param in chunk.parameters()
                     if getattr(param, "is_embedding_or_output_parameter", False)}
    groups = [(group["lr"], sum(id(p) in decoupled_ids for p in params),
               sum(id(p) not in decoupled_ids for p in params))
              for group, params in _model_params_by_group(state.optimizer)]
    return {"logged": iteration_report.metrics.learning_rate, "groups": groups}


def _train(argv: list[str]) -> dict:
    with stepping_trainer(argv) as (trainer, state, provider):
        steps = [_group_lrs(state, trainer.step(provider.step_batches(iteration)))
                 for iteration in range(STEPS)]
        num_decoupled = sum(getattr(param, "is_embedding_or_output_parameter", False)
                            for chunk in state.model for param in chunk.parameters())
        return {"steps": steps, "num_decoupled": num_decoupled}


def _check_step(step: dict, main_lr: float, decoupled_lr: float, num_held: int = 2) -> None:
    assert step["logged"] == pytest.approx(main_lr, rel=1e-12)
    held = 0
    for lr, num_decoupled, num_other in step["groups"]:
        assert not (num_decoupled and num_other)  # a group is one schedule or the other
        if num_decoupled:
            held += num_decoupled
            assert lr == pytest.approx(decoupled_lr, rel=1e-12)
        elif num_other:
            assert lr == pytest.approx(main_lr, rel=1e-12)
    assert held == num_held  # one rank: the word embeddings and the untied output layer


def test_embedding_and_output_follow_the_decoupled_schedule():
    (run,) = run_distributed(_train, 1, args=(TINY_GPT_ARGS + SCHEDULE + DECOUPLED,),
                             timeout_s=240)
    assert run["num_decoupled"] == 2
    main, decoupled = _reference_lrs(LR, MIN_LR), _reference_lrs(DECOUPLED_LR, DECOUPLED_MIN_LR)
    assert main != decoupled
    for step, main_lr, decoupled_lr in zip(run["steps"], main, decoupled):
        _check_step(step, main_lr, decoupled_lr)


def test_tied_embeddings_on_two_stages_follow_the_decoupled_schedule():
    """PP2 with tied embeddings: the first stage's word embeddings and the last stage's copy of
    them (megatron-core's output weight there) are both on the decoupled schedule."""
    tied = [flag for flag in SCHEDULE if flag != "--untie-embeddings-and-output-weights"]
    argv = TINY_GPT_ARGS + tied + DECOUPLED + ["--pipeline-model-parallel-size", "2"]
    runs = run_distributed(_train, 2, args=(argv,), timeout_s=240)
    main, decoupled = _reference_lrs(LR, MIN_LR), _reference_lrs(DECOUPLED_LR, DECOUPLED_MIN_LR)
    for run in runs:
        assert run["num_decoupled"] == 1
        for step, main_lr, decoupled_lr in zip(run["steps"], main, decoupled):
            _check_step(step, main_lr, decoupled_lr, num_held=1)


NEW_LR, NEW_DECOUPLED_LR = 2e-3, 1e-2
OVERRIDE = ["--lr", str(NEW_LR), "--decoupled-lr", str(NEW_DECOUPLED_LR),
            "--decoupled-min-lr", str(DECOUPLED_MIN_LR), "--override-opt_param-scheduler"]
SHARDED = ["--use-distributed-optimizer"]
RESUMES = {  # name: (first run's flags, resumed run's flags)
    "same": (DECOUPLED, DECOUPLED),
    "same_sharded": (DECOUPLED + SHARDED, DECOUPLED + SHARDED),
    "override": (DECOUPLED, OVERRIDE),
    "override_sharded": (DECOUPLED + SHARDED, OVERRIDE + SHARDED),
    "changed": (DECOUPLED, ["--decoupled-lr", str(NEW_DECOUPLED_LR),
                            "--decoupled-min-lr", str(DECOUPLED_MIN_LR)]),
    "turned_on": ([], DECOUPLED),
    "turned_off": (DECOUPLED, []),
}


def _resume(root: str, first: list[str], second: list[str]):
    """Two steps saved under ``root``, then a resumed run's third step (its LRs), or the
    resume's one-line refusal."""
    from megatron.varlen_training.config.from_flags import parse_run_config
    from megatron.varlen_training.errors import CheckpointError
    from megatron.varlen_training.pretrain import build_data_providers, pretrain
    from megatron.varlen_training.trainer import Trainer

    base = TINY_GPT_ARGS + SCHEDULE
    trainer = Trainer(parse_run_config(base + ["--train-iters", "2", "--lr-decay-iters", "4",
                                              "--save", root] + first, world_size=1),
                      console=False)
    try:
        pretrain(trainer)
    finally:
        trainer.close()
    trainer = Trainer(parse_run_config(base + ["--lr-decay-iters", "4", "--load", root] + second,
                                       world_size=1), console=False)
    try:
        trainer.start()
        provider = build_data_providers(trainer).train
        try:
            state = trainer.setup_model_and_optimizer()
        except CheckpointError as err:
            return str(err)
        return _group_lrs(state, trainer.step(provider.step_batches(state.iteration)))
    finally:
        trainer.close()


def _resume_all(root: str) -> dict:
    import os

    return {name: _resume(os.path.join(root, name), *flags) for name, flags in RESUMES.items()}


def test_resume_keeps_or_refuses_the_decoupled_group(tmp_path):
    (runs,) = run_distributed(_resume_all, 1, args=(str(tmp_path),), timeout_s=300)
    third = 3
    for name in ("same", "same_sharded"):
        _check_step(runs[name], _reference_lrs(LR, MIN_LR, third)[-1],
                    _reference_lrs(DECOUPLED_LR, DECOUPLED_MIN_LR, third)[-1])
    for name in ("override", "override_sharded"):
        _check_step(runs[name], _reference_lrs(NEW_LR, MIN_LR, third)[-1],
                    _reference_lrs(NEW_DECOUPLED_LR, DECOUPLED_MIN_LR, third)[-1])
    assert runs["changed"].startswith("--load: the checkpoint's schedule has --decoupled-lr "
                                      "0.005, this run has 0.01; pass --override-opt_param")
    assert "saved without --decoupled-lr, this run has 0.005" in runs["turned_on"]
    assert "saved with --decoupled-lr 0.005, this run has none" in runs["turned_off"]
    for name in ("changed", "turned_on", "turned_off"):
        assert "\n" not in runs[name]


def test_without_decoupled_min_lr_the_embedding_decays_to_min_lr():
    from megatron.varlen_training.config.from_flags import parse_run_config
    from megatron.varlen_training.training import core_optimizer_config

    run = parse_run_config(TINY_GPT_ARGS + SCHEDULE + ["--decoupled-lr", "5e-3"], world_size=1)
    config = core_optimizer_config(run)
    assert (config.decoupled_lr, config.decoupled_min_lr) == (5e-3, None)
    # megatron-core's override: max_lr only, so the group keeps the main min_lr (--min-lr).
    from megatron.core.optimizer import get_standard_config_overrides

    overrides = [value for value in get_standard_config_overrides(config).values()
                 if "max_lr" in value]
    assert overrides == [{"max_lr": 5e-3}]


@pytest.mark.parametrize("extra, message", [
    (["--decoupled-min-lr", "1e-4"], "--decoupled-min-lr 0.0001 needs --decoupled-lr"),
    (["--decoupled-lr", "1e-3", "--decoupled-min-lr", "2e-3"],
     "--decoupled-min-lr 0.002 exceeds --decoupled-lr 0.001"),
    (["--decoupled-lr", "1e-5"], "--min-lr 0.0001 exceeds --decoupled-lr 1e-05"),
    (["--decoupled-lr", "-1"], "--decoupled-lr"),
])
def test_bad_decoupled_values_are_one_line(extra, message):
    from megatron.varlen_training.arguments import ArgumentValidationError, parse_args

    with pytest.raises(ArgumentValidationError) as err:
        parse_args(TINY_GPT_ARGS + SCHEDULE + extra, world_size=1)
    assert message in str(err.value)
    assert "\n" not in str(err.value)
