"""--apply-layernorm-1p trains the same model as without it: every norm stores gamma - 1, so
the layout-invariant start (stored 0, plain 1) is the same function, Adam moves both
parameterisations alike (norm weights have no weight decay in megatron-core), and after three
steps each plain norm weight equals the zero-centered one's stored weight + 1 (float32
rounding), with the same losses and grad norms. LayerNorm (the "dense" probe cell), RMSNorm
with QK norms ("swiglu_rms_qkln") and the hybrid Mamba stack ("hybrid": the mixer's gated norm
is not zero-centered, as in megatron-core); packed runs equal unpacked ones with the flag too.

One single-rank launch running the nine trainings in sequence.
"""

import pytest
import torch

from tests.harness.multirank import run_distributed
from tests.harness.training_runs import assert_same_history, train_and_inspect
from tools.probe_combinations import cell_argv

RTOL = 1e-5
WEIGHT_ATOL = 1e-6  # stored + 1 vs plain after three Adam steps of lr 1e-3, float32
LAUNCH_TIMEOUT_S = 300
FLAG = "--apply-layernorm-1p"
# LayerNorm; RMSNorm with q/k layernorms; the hybrid Mamba stack (its layers' and final norms
# zero-centered, the mixer's gated norm not, as in megatron-core)
FEATURES = ("dense", "swiglu_rms_qkln", "hybrid")
RUNS = {f"{feature} {layout}{' 1p' if one_p else ''}": (feature, layout, one_p)
        for feature in FEATURES
        for layout, one_p in (("u_single", False), ("u_single", True), ("p_single", True))}


def _norms(trainer) -> dict:
    """Every norm weight of the trained model by canonical name, and what it adds to be gamma
    (1 for a zero-centered norm, else 0)."""
    from megatron.varlen_training.layout_invariant_init import canonical_parameter_name
    from megatron.varlen_training.model import unwrap

    norms, offsets = {}, {}
    for chunk in trainer.state.model:
        module = unwrap(chunk)
        for name, param in module.named_parameters():
            if name.endswith("norm.weight"):
                key = canonical_parameter_name(module, name, trainer.run.model.tied_output)
                norms[key] = param.detach().clone()
                owner = module.get_submodule(name.rpartition(".")[0])
                offsets[key] = float(getattr(owner, "zero_centered_gamma", False))
    return {"norms": norms, "offsets": offsets}


def _train_all(plan: dict) -> dict:
    trained = {name: train_and_inspect(argv, hybrid, _norms)
               for name, (argv, hybrid) in plan.items()}
    return {name: {"history": run["history"], **run["inspected"]}
            for name, run in trained.items()}


@pytest.fixture(scope="module")
def runs() -> dict:
    plan = {}
    for name, (feature, layout, one_p) in RUNS.items():
        argv, world, hybrid = cell_argv(feature, layout, "none")
        assert world == 1
        plan[name] = (argv + ([FLAG] if one_p else []), hybrid)
    return run_distributed(_train_all, 1, args=(plan,), timeout_s=LAUNCH_TIMEOUT_S)[0]


@pytest.mark.parametrize("feature", FEATURES)
def test_zero_centered_norms_train_the_same_model(runs, feature):
    plain, centered = runs[f"{feature} u_single"], runs[f"{feature} u_single 1p"]
    assert set(plain["offsets"].values()) == {0.0}
    # every layer's norm(s) and the final norm (the QK norms of the RMSNorm cell too); the
    # Mamba mixers' gated norms alone keep gamma
    gated = {name for name in centered["offsets"] if ".mixer." in name}
    assert {name for name, offset in centered["offsets"].items() if not offset} == gated
    assert len(centered["offsets"]) - len(gated) >= 4 + 1
    assert len(plain["history"]) == 3
    assert_same_history(centered["history"], plain["history"], RTOL, f"{feature} 1p vs plain")
    assert centered["norms"].keys() == plain["norms"].keys()
    for name, weight in plain["norms"].items():
        assert not torch.allclose(weight, torch.ones_like(weight)), f"{name} never trained"
        torch.testing.assert_close(centered["norms"][name] + centered["offsets"][name], weight,
                                   rtol=0, atol=WEIGHT_ATOL,
                                   msg=lambda m, n=name: f"{feature} {n}: {m}")


@pytest.mark.parametrize("feature", FEATURES)
def test_packed_equals_unpacked_with_zero_centered_norms(runs, feature):
    assert_same_history(runs[f"{feature} p_single 1p"]["history"],
                        runs[f"{feature} u_single 1p"]["history"], RTOL, f"{feature} packed 1p")


@pytest.mark.parametrize("name", ["decoder.layers.3.input_layernorm.weight",
                                  "decoder.final_layernorm.weight",
                                  "decoder.layers.0.self_attention.q_layernorm.weight",
                                  # Transformer Engine's fused norm + linear (GPU layer specs)
                                  "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight",
                                  "decoder.layers.1.mlp.linear_fc1.layer_norm_weight"])
def test_layout_invariant_init_starts_every_norm_at_gamma_one(name):
    """Plain norms start at 1, zero-centered ones (stored gamma - 1) at 0: the same norm."""
    from megatron.varlen_training.layout_invariant_init import _draw

    shape = [8]
    assert torch.equal(_draw(name, shape, seed=1, std=0.02, output_std=0.01), torch.ones(shape))
    assert torch.equal(_draw(name, shape, seed=1, std=0.02, output_std=0.01,
                             zero_centered=True), torch.zeros(shape))


def test_use_checkpoint_args_takes_zero_centered_norms(tmp_path):
    """Megatron-LM's load_args_from_checkpoint forces apply_layernorm_1p from the checkpoint
    (``_set_arg(..., force=True)``): its value replaces the command line's either way."""
    from megatron.varlen_training.config.from_flags import parse_run_config
    from tests.unit_tests.varlen_training import test_use_checkpoint_args as ckptargs

    centered = ckptargs._record(tmp_path / "centered", 2,
                                ckptargs.ARCHITECTURE + ckptargs.TRAINING + [FLAG])
    run = parse_run_config(ckptargs.TRAINING + ckptargs.USE + ["--load", str(centered)],
                           world_size=1)
    assert run.model.layernorm_zero_centered_gamma is True
    plain = ckptargs._record(tmp_path / "plain", 2, ckptargs.ARCHITECTURE + ckptargs.TRAINING)
    run = parse_run_config(ckptargs.TRAINING + ckptargs.USE + ["--load", str(plain), FLAG],
                           world_size=1)
    assert run.model.layernorm_zero_centered_gamma is False


def test_resume_with_the_other_norm_parameterisation_is_refused(tmp_path):
    """The stored norm weights mean gamma - 1 with the flag and gamma without: run_args.json
    records it, a resume with the other setting is one line; a checkpoint from before the key
    was recorded had plain norms (the flag was refused then)."""
    import json

    from megatron.varlen_training.config.from_flags import parse_run_config
    from megatron.varlen_training.errors import CheckpointError
    from megatron.varlen_training.resume.consistency import check_run_args
    from megatron.varlen_training.resume.run_args_keys import RUN_ARGS_FILENAME
    from megatron.varlen_training.resume.run_args_record import save_run_args

    argv, _, _ = cell_argv("dense", "u_single", "none")
    plain, centered = (parse_run_config(argv + extra, world_size=1) for extra in ([], [FLAG]))
    save_run_args(str(tmp_path), centered)
    assert check_run_args(str(tmp_path), centered, check_data=False) is None
    with pytest.raises(CheckpointError, match="--apply-layernorm-1p True, this run has False"
                       ) as err:
        check_run_args(str(tmp_path), plain, check_data=False)
    assert "\n" not in str(err.value)
    path = tmp_path / RUN_ARGS_FILENAME
    recorded = json.loads(path.read_text())
    del recorded["layernorm_zero_centered_gamma"]
    path.write_text(json.dumps(recorded))
    assert check_run_args(str(tmp_path), plain, check_data=False) is None
