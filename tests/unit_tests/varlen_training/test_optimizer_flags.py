"""Megatron-LM's optimizer-choice and weight-decay flags (optimizer_arguments.py).

- ``--optimizer sgd --sgd-momentum m``: every weight of a tiny GPT moves, step after step, as a
  float64 hand computation of torch's SGD says from the same gradients (the main grads each step
  produced): ``d = g + wd_p * p``, ``buf = d`` at the first step and ``m * buf + d`` after,
  ``p -= lr * buf``, with ``wd_p`` Megatron-LM's rule (none on biases and 1-D weights).
- ``--apply-wd-to-qk-layernorm`` (and ``--no-weight-decay-cond-type apply_wd_to_qk_layernorm``):
  the same computation with weight decay on the q/k layernorm weights, the other 1-D weights
  still without.
- An SGD run saved at iteration 2 resumes as the straight run continues (its momentum buffers
  restored: megatron-core 0.16.1 alone cannot build their loading template, sgd_state.py);
  a checkpoint of the other optimizer is one line naming --no-load-optim, which then loads it.
- Megatron-LM's other optimizers, SGD with the distributed optimizer and CPU offload are one
  line each; the Muon/Lion/offload tuning flags are accepted (no effect without those).

Two 1-rank launches train the runs (a few seconds each).
"""

import os

import pytest
import torch

from megatron.varlen_training.arguments import ArgumentValidationError, parse_args
from megatron.varlen_training.config.from_flags import parse_run_config
from tests.harness.multirank import run_distributed
from megatron.varlen_training.errors import CheckpointError
from tests.harness.training_runs import TINY_GPT_ARGS, stepping_trainer, train_on_this_rank

STEPS = 3
LR, WEIGHT_DECAY, MOMENTUM = 0.05, 0.1, 0.7
SGD = TINY_GPT_ARGS + [
    "--train-iters", str(STEPS), "--optimizer", "sgd", "--sgd-momentum", str(MOMENTUM),
    "--lr", str(LR), "--lr-decay-style", "constant", "--weight-decay", str(WEIGHT_DECAY),
    "--clip-grad", "0"]
QK_LAYERNORM = ["--qk-layernorm", "--normalization", "RMSNorm", "--position-embedding-type",
                "rope"]
LAUNCH_TIMEOUT_S = 240


def _named_weights(state) -> dict[str, torch.Tensor]:
    return {f"{i}.{name}": param for i, chunk in enumerate(state.model)
            for name, param in chunk.named_parameters()}


def _steps(argv: list[str]) -> dict:
    """Each step's weights before it, its main grads and the weights after it (float64)."""
    with stepping_trainer(argv) as (trainer, state, provider):
        weights = _named_weights(state)
        before, grads = [], []
        for iteration in range(STEPS):
            before.append({n: p.detach().double().clone() for n, p in weights.items()})
            trainer.step(provider.step_batches(iteration))
            grads.append({n: p.main_grad.detach().double().clone()
                          for n, p in weights.items()})
        after = {n: p.detach().double().clone() for n, p in weights.items()}
        return {"before": before, "grads": grads, "after": after}


def _cases() -> dict:
    return {"sgd": _steps(SGD),
            "sgd_qk_wd": _steps(SGD + QK_LAYERNORM + ["--apply-wd-to-qk-layernorm"]),
            "sgd_qk_cond": _steps(SGD + QK_LAYERNORM + [
                "--no-weight-decay-cond-type", "apply_wd_to_qk_layernorm"]),
            "sgd_qk": _steps(SGD + QK_LAYERNORM)}


@pytest.fixture(scope="module")
def cases() -> dict:
    return run_distributed(_cases, 1, timeout_s=LAUNCH_TIMEOUT_S)[0]


def _decays(name: str, shape: torch.Size, qk_layernorm_decays: bool) -> bool:
    """Megatron-LM's rule: no weight decay on biases and 1-D weights, but (with
    --apply-wd-to-qk-layernorm) on the q/k layernorm weights."""
    if qk_layernorm_decays and ("q_layernorm." in name or "k_layernorm." in name):
        return True
    return not (name.endswith(".bias") or len(shape) == 1)


def _reference_sgd(run: dict, qk_layernorm_decays: bool = False) -> dict[str, torch.Tensor]:
    """torch SGD (momentum, L2 weight decay, no dampening) by hand in float64."""
    weights = {n: p.clone() for n, p in run["before"][0].items()}
    momentum = {}
    for grads in run["grads"]:
        for name, weight in weights.items():
            decay = WEIGHT_DECAY if _decays(name, weight.shape, qk_layernorm_decays) else 0.0
            step = grads[name] + decay * weight
            momentum[name] = step if name not in momentum else MOMENTUM * momentum[name] + step
            weights[name] = weight - LR * momentum[name]
    return weights


@pytest.mark.parametrize("case, qk_decays", [("sgd", False), ("sgd_qk", False),
                                             ("sgd_qk_wd", True), ("sgd_qk_cond", True)])
def test_sgd_steps_are_torch_sgd_by_hand(cases, case, qk_decays):
    run = cases[case]
    reference = _reference_sgd(run, qk_decays)
    assert run["after"].keys() == reference.keys()
    for name, weight in run["after"].items():
        torch.testing.assert_close(weight, reference[name], rtol=0, atol=2e-6, msg=name)
        assert not torch.equal(weight, run["before"][0][name]), f"{name} did not move"


def test_qk_layernorm_weight_decay_changes_only_those_weights(cases):
    """The q/k layernorm weights are the ones the flag decays (the runs differ there first)."""
    qk = [name for name in cases["sgd_qk"]["after"] if "_layernorm." in name
          and ("q_layernorm" in name or "k_layernorm" in name)]
    assert qk, "the model has q/k layernorm weights"
    with_wd, without = cases["sgd_qk_wd"], cases["sgd_qk"]
    first = lambda run, name: run["before"][1][name]  # noqa: E731 - weights after step 1
    for name in qk:
        assert not torch.equal(first(with_wd, name), first(without, name)), name
    assert torch.equal(first(with_wd, "0.module.embedding.word_embeddings.weight"),
                       first(without, "0.module.embedding.word_embeddings.weight"))


def test_optimizer_fields_reach_the_config():
    run = parse_run_config(SGD + ["--apply-wd-to-qk-layernorm"], world_size=1)
    assert (run.optimizer.optimizer, run.optimizer.sgd_momentum) == ("sgd", MOMENTUM)
    assert run.optimizer.apply_wd_to_qk_layernorm
    adam = parse_run_config(TINY_GPT_ARGS + ["--train-iters", "1"], world_size=1)
    assert (adam.optimizer.optimizer, adam.optimizer.apply_wd_to_qk_layernorm) == ("adam", False)


@pytest.mark.parametrize("extra, needle", [
    (["--optimizer", "muon"], "--optimizer muon is not supported"),
    (["--optimizer", "dist_muon"], "--optimizer dist_muon is not supported"),
    (["--optimizer", "lion"], "--optimizer lion is not supported"),
    (["--optimizer", "sgd", "--use-distributed-optimizer"],
     "--optimizer sgd with --use-distributed-optimizer is not supported"),
    (["--optimizer-cpu-offload"], "--optimizer-cpu-offload is not supported"),
    (["--freeze-all-layers"], "--freeze-all-layers is not supported"),
    (["--dump-param-to-param-group-map", "x.json"],
     "--dump-param-to-param-group-map x.json is not supported"),
    (["--sgd-momentum", "-0.5"], "--sgd-momentum"),
])
def test_refusals_are_one_line(extra, needle):
    with pytest.raises(ArgumentValidationError) as err:
        parse_args(TINY_GPT_ARGS + ["--train-iters", "1"] + extra, world_size=1)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_tuning_flags_of_refused_optimizers_are_accepted():
    """Megatron-LM reads them only with --optimizer muon/lion or --optimizer-cpu-offload."""
    args = parse_args(TINY_GPT_ARGS + [
        "--train-iters", "1", "--muon-momentum", "0.95", "--muon-no-split-qkv",
        "--muon-tp-mode", "duplicated", "--lion-beta1", "0.9", "--optimizer-offload-fraction",
        "0.5", "--no-pin-cpu-grads", "--use-torch-optimizer-for-cpu-offload"], world_size=1)
    assert args.optimizer == "adam" and args.muon_split_qkv is False


RESUMED = ["--train-iters", "4", "--lr-decay-iters", "4"]
ADAM = TINY_GPT_ARGS + RESUMED


def _losses_or_refusal(argv: list[str]) -> dict:
    try:
        return {"losses": [step["lm_loss"] for step in train_on_this_rank(argv)["history"]]}
    except CheckpointError as err:
        return {"refusal": str(err)}


def _resume_cases(folder: str) -> dict:
    sgd = SGD + RESUMED
    sgd_saved, adam_saved = os.path.join(folder, "sgd"), os.path.join(folder, "adam")
    _losses_or_refusal(sgd + ["--train-iters", "2", "--save", sgd_saved])
    _losses_or_refusal(ADAM + ["--train-iters", "2", "--save", adam_saved])
    return {"straight": _losses_or_refusal(sgd),
            "resume": _losses_or_refusal(sgd + ["--load", sgd_saved]),
            "adam_into_sgd": _losses_or_refusal(sgd + ["--load", adam_saved]),
            "sgd_into_adam": _losses_or_refusal(ADAM + ["--load", sgd_saved]),
            "sgd_into_adam_weights": _losses_or_refusal(ADAM + ["--load", sgd_saved,
                                                                "--no-load-optim"])}


@pytest.fixture(scope="module")
def resumes(tmp_path_factory) -> dict:
    folder = str(tmp_path_factory.mktemp("sgd_resume"))
    return run_distributed(_resume_cases, 1, args=(folder,), timeout_s=LAUNCH_TIMEOUT_S)[0]


def test_sgd_resume_continues_the_straight_run(resumes):
    assert resumes["resume"]["losses"] == resumes["straight"]["losses"][2:]


@pytest.mark.parametrize("case, saved, mine", [("adam_into_sgd", "adam", "sgd"),
                                               ("sgd_into_adam", "sgd", "adam")])
def test_other_optimizers_state_is_one_line(resumes, case, saved, mine):
    refusal = resumes[case]["refusal"]
    assert f"holds --optimizer {saved} state, this run is --optimizer {mine}: add " \
        f"--no-load-optim" in refusal and "\n" not in refusal
    assert len(resumes["sgd_into_adam_weights"]["losses"]) == 2


@pytest.mark.parametrize("spelling, dest", [
    ("--override-opt-param-scheduler", "override_opt_param_scheduler"),
    ("--use-checkpoint-opt-param-scheduler", "use_checkpoint_opt_param_scheduler"),
])
def test_all_dash_scheduler_spellings(spelling, dest):
    """Megatron-LM core_v0.16.1 accepts both spellings of the two scheduler flags."""
    assert getattr(parse_args(TINY_GPT_ARGS + ["--train-iters", "1", spelling],
                              world_size=1), dest) is True


@pytest.mark.parametrize("extra, needle", [
    (["--iterations-to-skip", "3", "5"], "--iterations-to-skip 3 5 is not supported"),
    (["--train-sync-interval", "10"], "--train-sync-interval 10 is not supported"),
    # honoured with --rampup-batch-size only (test_batch_rampup.py)
    (["--decrease-batch-size-if-needed"], "--decrease-batch-size-if-needed needs "
                                          "--rampup-batch-size"),
    (["--disable-gloo-process-groups"], "--disable-gloo-process-groups is not supported"),
    (["--high-priority-stream-groups", "dp"], "--high-priority-stream-groups dp is not"),
])
def test_training_loop_refusals_are_one_line(extra, needle):
    """training_loop_arguments.py: Megatron-LM loop features not implemented here."""
    with pytest.raises(ArgumentValidationError) as err:
        parse_args(TINY_GPT_ARGS + ["--train-iters", "1"] + extra, world_size=1)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_training_loop_neutral_values_are_accepted():
    parse_args(TINY_GPT_ARGS + ["--train-iters", "1", "--high-priority-stream-groups"],
               world_size=1)
