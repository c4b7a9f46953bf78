"""--squared-relu (Megatron-LM's; every Nemotron-H recipe carries it): each MLP of the built
GPT and hybrid Mamba models computes relu(x W1^T + b1)^2 W2^T + b2, checked against a float64
computation from that layer's own weights (and unlike GELU's output); packed training with
it equals unpacked (3 steps: loss and grad norm, float32 rounding) and is another model than
GELU's (its losses differ). One single-rank launch running the five trainings in sequence.
The flag's config field against Megatron-LM's is in test_transformer_config_reference.py.
"""

import pytest
import torch

from tests.harness.multirank import run_distributed
from tests.harness.training_runs import assert_same_history, train_and_inspect
from tools.probe_combinations import cell_argv

RTOL = 1e-5
LAUNCH_TIMEOUT_S = 300
FLAG = "--squared-relu"
RUNS = {"dense unpacked": ("dense", "u_single", True),
        "dense packed": ("dense", "p_single", True),
        "dense gelu": ("dense", "u_single", False),
        "hybrid unpacked": ("hybrid", "u_single", True),
        "hybrid packed": ("hybrid", "p_single", True)}


def _first_mlp(model_chunks) -> torch.nn.Module:
    from megatron.core.transformer.mlp import MLP

    return next(module for chunk in model_chunks for module in chunk.modules()
                if type(module) is MLP)


def _mlp_outputs(mlp: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the module's output, the float64 squared-ReLU reference, the float64 GELU one) for a
    fixed input [s, b, h]; the biases the layer returns unadded are added."""
    fc1, fc2 = mlp.linear_fc1, mlp.linear_fc2
    x = torch.randn(5, 2, fc1.weight.shape[1], generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out, bias = mlp(x)
        out = out + bias if bias is not None else out

        def reference(activation) -> torch.Tensor:
            hidden = x.double() @ fc1.weight.double().T
            if fc1.bias is not None:
                hidden = hidden + fc1.bias.double()
            result = activation(hidden) @ fc2.weight.double().T
            return result + fc2.bias.double() if fc2.bias is not None else result

        return (out.double(), reference(lambda h: torch.relu(h) ** 2),
                reference(torch.nn.functional.gelu))


def _train_all(plan: dict) -> dict:
    return {name: train_and_inspect(argv, hybrid,
                                    lambda trainer: _mlp_outputs(_first_mlp(trainer.state.model)))
            for name, (argv, hybrid) in plan.items()}


@pytest.fixture(scope="module")
def runs() -> dict:
    plan = {}
    for name, (feature, layout, squared) in RUNS.items():
        argv, world, hybrid = cell_argv(feature, layout, "none")
        assert world == 1
        plan[name] = (argv + ([FLAG] if squared else []), hybrid)
    return run_distributed(_train_all, 1, args=(plan,), timeout_s=LAUNCH_TIMEOUT_S)[0]


@pytest.mark.parametrize("name", ["dense unpacked", "hybrid unpacked"])
def test_the_mlp_computes_squared_relu(runs, name):
    out, squared, gelu = runs[name]["inspected"]
    assert torch.allclose(out, squared, rtol=RTOL, atol=1e-6)
    assert not torch.allclose(out, gelu, rtol=1e-2, atol=1e-3)  # the check can fail


def test_without_the_flag_the_mlp_is_gelu(runs):
    out, squared, gelu = runs["dense gelu"]["inspected"]
    assert torch.allclose(out, gelu, rtol=RTOL, atol=1e-6)
    assert not torch.allclose(out, squared, rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("feature", ["dense", "hybrid"])
def test_packed_training_equals_unpacked(runs, feature):
    assert len(runs[f"{feature} packed"]["history"]) == 3
    assert_same_history(runs[f"{feature} packed"]["history"],
                        runs[f"{feature} unpacked"]["history"], RTOL, f"{feature} packed")


def test_a_resume_or_fine_tune_keeps_the_activation(tmp_path):
    """The checkpoint records it: loading GELU weights into squared-ReLU MLPs (or back) is
    another model, refused in one line naming the flag (also for --finetune)."""
    from megatron.varlen_training.config.from_flags import parse_run_config
    from megatron.varlen_training.errors import CheckpointError
    from megatron.varlen_training.load_options import FINETUNE
    from megatron.varlen_training.resume.consistency import check_run_args
    from megatron.varlen_training.resume.run_args_record import save_run_args

    argv, _, _ = cell_argv("dense", "u_single", "none")
    save_run_args(str(tmp_path), parse_run_config(argv, world_size=1), iteration=3)
    squared = parse_run_config(argv + [FLAG], world_size=1)
    for parts in ({}, {"parts": FINETUNE}):
        with pytest.raises(CheckpointError) as err:
            check_run_args(str(tmp_path), squared, check_data=False, **parts)
        assert "--squared-relu" in str(err.value) and "\n" not in str(err.value)


def test_use_checkpoint_args_takes_the_activation(tmp_path):
    """Megatron-LM's load_args_from_checkpoint forces squared_relu from the checkpoint
    (``_set_arg(..., force=True)``): its value replaces the command line's either way."""
    from megatron.varlen_training.config.from_flags import parse_run_config
    from tests.unit_tests.varlen_training import test_use_checkpoint_args as ckptargs

    architecture = [arg for arg in ckptargs.ARCHITECTURE if arg != "--swiglu"]  # one activation
    squared = ckptargs._record(tmp_path / "squared", 2,
                               architecture + ckptargs.TRAINING + [FLAG])
    run = parse_run_config(ckptargs.TRAINING + ckptargs.USE + ["--load", str(squared)],
                           world_size=1)
    assert run.model.squared_relu is True
    gelu = ckptargs._record(tmp_path / "gelu", 2, architecture + ckptargs.TRAINING)
    run = parse_run_config(ckptargs.TRAINING + ckptargs.USE + ["--load", str(gelu), FLAG],
                           world_size=1)
    assert run.model.squared_relu is False


def test_it_is_another_model_than_gelus(runs):
    squared = [step["lm_loss"] for step in runs["dense unpacked"]["history"]]
    gelu = [step["lm_loss"] for step in runs["dense gelu"]["history"]]
    assert squared != pytest.approx(gelu, rel=1e-4)
