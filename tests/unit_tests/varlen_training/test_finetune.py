"""--finetune, --no-load-optim, --no-load-rng and --pretrained-checkpoint behave as Megatron-LM
documents them (its arguments' help and ``load_checkpoint``).

One 2-rank launch saves a checkpoint after 3 iterations; a second loads it under each flag set
and inspects the state right after loading, against two independent references: a fresh run
(nothing loaded) and a plain resume (everything loaded):

- weights: every flag set loads the checkpoint's weights (== the resume's, != the fresh run's);
- iteration: kept by a resume, --no-load-optim and --no-load-rng; 0 with --finetune and with
  --pretrained-checkpoint when --load is empty;
- optimizer state and LR schedule: restored by a resume (Adam moments, step 3, scheduler at 3
  steps); absent with --no-load-optim and --finetune (a fresh optimizer and schedule);
- random states: the saved ones with a resume and --no-load-optim; the freshly seeded ones (==
  the fresh run's) with --no-load-rng and --finetune, so dropout masks differ from a resume;
- --finetune on other data (seed, batch size, length distribution) and another optimizer
  layout is not refused; a resume with the same changes is, in one line; a model of another
  shape is refused even with --finetune.
"""

import hashlib
import json

import pytest
import torch

from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.errors import CheckpointError
from megatron.varlen_training.trainer import Trainer
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import TINY_GPT_ARGS, train_on_this_rank

WORLD = 2
SAVED_ITERS = 3
# The LR schedule's length is fixed, so the resumes below are not refused for a schedule change.
BASE = TINY_GPT_ARGS + ["--hidden-dropout", "0.1", "--train-iters", "5", "--lr-decay-iters", "5"]
OTHER_LENGTHS = json.dumps({"mode": "distribution", "type": "lognormal", "min_seq_len": 2,
                            "max_seq_len": 32, "mean_seq_len": 9, "lognormal_sigma": 0.5})
BF16 = ["--bf16"]
OTHER_DATA = ["--seed", "99", "--global-batch-size", "8", "--sft",
              "--sft-mock-dataset-config-json", OTHER_LENGTHS]


def _digest(tensors) -> str:
    digest = hashlib.sha256()
    for tensor in tensors:
        raw = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)  # bf16 too
        digest.update(raw.numpy().tobytes())
    return digest.hexdigest()


def _inspect(argv: list[str]) -> dict:
    """Set-up (and --load) of the run ``argv`` describes, then its state; or the error."""
    run = parse_run_config(argv, world_size=torch.distributed.get_world_size())
    trainer = Trainer(run)
    try:
        trainer.start()
        try:
            state = trainer.setup_model_and_optimizer()
        except CheckpointError as err:
            return {"error": str(err)}
        inner = [opt.optimizer for opt in getattr(state.optimizer, "chained_optimizers",
                                                  [state.optimizer])]
        adam = [s for opt in inner for s in opt.state.values()]
        return {
            "main_params_follow_weights": _main_params_follow_weights(state.optimizer),
            "iteration": state.iteration,
            "weights": _digest(p for chunk in state.model for p in chunk.parameters()),
            "adam_states": sum(1 for s in adam if "exp_avg" in s),
            "adam_steps": sorted({float(s["step"]) for s in adam if "step" in s}),
            "scheduler_steps": state.scheduler.num_steps,
            "torch_rng": _digest([torch.get_rng_state()]),
        }
    finally:
        trainer.close()


def _main_params_follow_weights(optimizer) -> bool | None:
    """bf16: whether the optimizer's fp32 main copy holds the model's (loaded) weights; None
    for an fp32 optimizer (no separate copy)."""
    pairs = [(model, main) for opt in getattr(optimizer, "chained_optimizers", [optimizer])
             for models, mains in zip(getattr(opt, "float16_groups", []),
                                      getattr(opt, "fp32_from_float16_groups", []))
             for model, main in zip(models, mains)]
    if not pairs:
        return None
    return all(torch.equal(main.to(model.dtype), model) for model, main in pairs)


def _inspect_all(argvs: dict) -> dict:
    return {name: _inspect(argv) for name, argv in argvs.items()}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("pretrained")
    run_distributed(train_on_this_rank, WORLD, timeout_s=600, args=(
        BASE + ["--train-iters", str(SAVED_ITERS), "--save", str(root)],))
    return str(root)


@pytest.fixture(scope="module")
def bf16_checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("pretrained_bf16")
    run_distributed(train_on_this_rank, WORLD, timeout_s=600, args=(
        BASE + BF16 + ["--train-iters", str(SAVED_ITERS), "--save", str(root)],))
    return str(root)


@pytest.fixture(scope="module")
def states(checkpoint, bf16_checkpoint, tmp_path_factory):
    empty = str(tmp_path_factory.mktemp("empty_load"))
    load = ["--load", checkpoint]
    argvs = {
        "fresh": BASE,
        "resume": BASE + load,
        "no_load_optim": BASE + load + ["--no-load-optim"],
        "no_load_rng": BASE + load + ["--no-load-rng"],
        "finetune": BASE + load + ["--finetune"],
        "pretrained_empty_load": BASE + ["--load", empty, "--pretrained-checkpoint", checkpoint],
        "pretrained_missing_load": BASE + ["--pretrained-checkpoint", checkpoint],
        "pretrained_but_load_has_one": BASE + load + ["--pretrained-checkpoint", empty],
        "finetune_other_data": BASE + load + ["--finetune", "--use-distributed-optimizer"]
        + OTHER_DATA,
        "resume_other_data": BASE + load + OTHER_DATA,
        "resume_other_optimizer_layout": BASE + load + ["--use-distributed-optimizer"],
        "no_load_optim_other_optimizer_layout": BASE + load + ["--no-load-optim",
                                                               "--use-distributed-optimizer"],
        "finetune_other_model": BASE + load + ["--finetune", "--hidden-size", "64"],
        "bf16_fresh": BASE + BF16,
        "bf16_finetune": BASE + BF16 + ["--load", bf16_checkpoint, "--finetune"],
        "bf16_resume": BASE + BF16 + ["--load", bf16_checkpoint],
    }
    ranks = run_distributed(_inspect_all, WORLD, args=(argvs,), timeout_s=600)
    return ranks[0]  # rank 1 holds the same facts (its own weights shard and RNG)


def test_every_load_brings_the_weights(states):
    assert states["resume"]["weights"] != states["fresh"]["weights"]
    for name in ("no_load_optim", "no_load_rng", "finetune", "pretrained_empty_load",
                 "pretrained_missing_load", "finetune_other_data",
                 "no_load_optim_other_optimizer_layout"):
        assert states[name]["weights"] == states["resume"]["weights"], name


def test_iteration(states):
    assert states["fresh"]["iteration"] == 0
    for name in ("resume", "no_load_optim", "no_load_rng", "pretrained_but_load_has_one"):
        assert states[name]["iteration"] == SAVED_ITERS, name
    for name in ("finetune", "pretrained_empty_load", "pretrained_missing_load",
                 "finetune_other_data"):
        assert states[name]["iteration"] == 0, name


def test_optimizer_state_and_schedule(states):
    gbs = 4  # TINY_GPT_ARGS
    resume = states["resume"]
    assert resume["adam_states"] > 0 and resume["adam_steps"] == [float(SAVED_ITERS)]
    assert resume["scheduler_steps"] == SAVED_ITERS * gbs
    assert states["no_load_rng"]["adam_states"] == resume["adam_states"]
    for name in ("fresh", "no_load_optim", "finetune", "pretrained_empty_load"):
        assert states[name]["adam_states"] == 0, name
        assert states[name]["scheduler_steps"] == 0, name


def test_random_states(states):
    fresh, resume = states["fresh"]["torch_rng"], states["resume"]["torch_rng"]
    assert resume != fresh, "a resume restores the saved generator"
    assert states["no_load_optim"]["torch_rng"] == resume
    for name in ("no_load_rng", "finetune", "pretrained_empty_load"):
        assert states[name]["torch_rng"] == fresh, name


def test_finetune_is_not_a_resume(states):
    assert "error" not in states["finetune_other_data"]
    assert "error" not in states["no_load_optim_other_optimizer_layout"]
    assert "--seed" in states["resume_other_data"]["error"]
    assert "--use-distributed-optimizer" in states["resume_other_optimizer_layout"]["error"]
    assert "--hidden-size" in states["finetune_other_model"]["error"]


def test_half_precision_main_params_follow_the_loaded_weights(states):
    """Without the optimizer state, the fp32 main copy of bf16 weights is rebuilt from the
    loaded weights (Megatron-LM's reload_model_params); else the first step would start from
    the freshly initialised copy."""
    assert states["fresh"]["main_params_follow_weights"] is None  # fp32: no separate copy
    assert states["bf16_finetune"]["weights"] == states["bf16_resume"]["weights"]
    assert states["bf16_finetune"]["weights"] != states["bf16_fresh"]["weights"]
    assert states["bf16_finetune"]["main_params_follow_weights"] is True
    assert states["bf16_resume"]["main_params_follow_weights"] is True
