"""--quick-geglu with --glu-linear-offset and --activation-func-clamp-value (gpt-oss's MLP, as
Megatron-LM's flags build it): each dense MLP and each MoE expert computes
q(min(g, c)) * (clamp(l, -c, c) + offset) with q(x) = x * sigmoid(1.702 x) on the two halves of
fc1 (g the gate, l the linear half), checked against a float64 computation from that layer's own
weights and unlike the unclamped, offset-free one; packed training equals unpacked (3 steps,
float32 rounding). One single-rank launch runs the trainings in sequence. The config fields
against Megatron-LM's are in test_transformer_config_reference.py.
"""

import pytest
import torch

from tests.harness.multirank import run_distributed
from tests.harness.training_runs import assert_same_history, train_and_inspect
from tools.probe_combinations import cell_argv

RTOL = 1e-5
LAUNCH_TIMEOUT_S = 300
OFFSET, CLAMP = 1.0, 0.05  # a clamp inside the tiny model's fc1 outputs, so it acts
GPT_OSS_MLP = ["--quick-geglu", "--glu-linear-offset", str(OFFSET),
               "--activation-func-clamp-value", str(CLAMP)]
RUNS = {"dense unpacked": ("dense", "u_single"), "dense packed": ("dense", "p_single"),
        "moe unpacked": ("moe", "u_single"), "moe packed": ("moe", "p_single")}


def _first(model_chunks, kind: str) -> torch.nn.Module:
    from megatron.core.transformer.mlp import MLP
    from megatron.core.transformer.moe.experts import SequentialMLP

    for chunk in model_chunks:
        for module in chunk.modules():
            if kind == "dense" and type(module) is MLP:
                return module
            if kind == "moe" and isinstance(module, SequentialMLP):
                return module.local_experts[0]  # an expert is a megatron-core MLP
    raise AssertionError(f"no {kind} MLP")


def _reference(x, fc1, fc2, offset, clamp):
    """float64 gpt-oss MLP from the layer's weights (no biases: the features disable them)."""
    gate, linear = (x.double() @ fc1.weight.double().T).chunk(2, dim=-1)
    if clamp is not None:
        gate, linear = gate.clamp(max=clamp), linear.clamp(-clamp, clamp)
    return (gate * torch.sigmoid(1.702 * gate) * (linear + offset)) @ fc2.weight.double().T


def _mlp_outputs(kind: str):
    def inspect(trainer):
        mlp = _first(trainer.state.model, kind)
        x = torch.randn(5, 2, mlp.linear_fc1.weight.shape[1],
                        generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            out, bias = mlp(x)
            assert bias is None
            return (out.double(), _reference(x, mlp.linear_fc1, mlp.linear_fc2, OFFSET, CLAMP),
                    _reference(x, mlp.linear_fc1, mlp.linear_fc2, 0.0, None))
    return inspect


def _train_all(plan: dict) -> dict:
    return {name: train_and_inspect(argv, False, _mlp_outputs(kind))
            for name, (argv, kind) in plan.items()}


@pytest.fixture(scope="module")
def runs() -> dict:
    plan = {}
    for name, (feature, layout) in RUNS.items():
        argv, world, _ = cell_argv(feature, layout, "none")
        assert world == 1
        plan[name] = (argv + GPT_OSS_MLP, feature)
    return run_distributed(_train_all, 1, args=(plan,), timeout_s=LAUNCH_TIMEOUT_S)[0]


@pytest.mark.parametrize("name", ["dense unpacked", "moe unpacked"])
def test_the_mlp_computes_clamped_quick_geglu_with_offset(runs, name):
    out, expected, plain = runs[name]["inspected"]
    assert torch.allclose(out, expected, rtol=RTOL, atol=1e-7)
    assert not torch.allclose(out, plain, rtol=1e-2, atol=1e-4)  # offset and clamp act


@pytest.mark.parametrize("feature", ["dense", "moe"])
def test_packed_training_equals_unpacked(runs, feature):
    assert len(runs[f"{feature} packed"]["history"]) == 3
    assert_same_history(runs[f"{feature} packed"]["history"],
                        runs[f"{feature} unpacked"]["history"], RTOL, f"{feature} packed")


@pytest.mark.parametrize("flags, words", [
    (["--quick-geglu", "--swiglu"], ["--swiglu and --quick-geglu", "give one"]),
    (["--quick-geglu", "--squared-relu"], ["--squared-relu and --quick-geglu"]),
    (["--glu-linear-offset", "1"], ["--glu-linear-offset 1.0", "needs --swiglu or --quick-geglu"]),
    (["--activation-func-clamp-value", "7"], ["--activation-func-clamp-value 7.0", "gated"]),
    (["--quick-geglu", "--activation-func-clamp-value", "0"], ["--activation-func-clamp-value"]),
])
def test_what_does_nothing_or_conflicts_is_one_line(flags, words):
    from megatron.varlen_training.config.from_flags import parse_run_config
    from megatron.varlen_training.flag_errors import ArgumentValidationError

    argv, _, _ = cell_argv("dense", "u_single", "none")
    with pytest.raises(ArgumentValidationError) as err:
        parse_run_config(argv + flags, world_size=1)
    for word in words:
        assert word in str(err.value), (word, str(err.value))
    assert "\n" not in str(err.value)


def test_a_resume_keeps_the_activation(tmp_path):
    """Recorded: loading plain GELU weights into a quick-GEGLU model (or another offset) is
    another model, refused in one line naming the flag."""
    from megatron.varlen_training.config.from_flags import parse_run_config
    from megatron.varlen_training.errors import CheckpointError
    from megatron.varlen_training.resume.consistency import check_run_args
    from megatron.varlen_training.resume.run_args_record import save_run_args

    argv, _, _ = cell_argv("dense", "u_single", "none")
    save_run_args(str(tmp_path), parse_run_config(argv + GPT_OSS_MLP, world_size=1),
                  iteration=3)
    other_offset = GPT_OSS_MLP[:2] + ["0.5"] + GPT_OSS_MLP[3:]
    swiglu = ["--swiglu", "--ffn-hidden-size", "128"]  # the quick-GEGLU model's width
    for flags, flag in ((other_offset, "--glu-linear-offset"), (swiglu, "--swiglu")):
        with pytest.raises(CheckpointError) as err:
            check_run_args(str(tmp_path), parse_run_config(argv + flags, world_size=1),
                           check_data=False)
        assert flag in str(err.value) and "\n" not in str(err.value)
