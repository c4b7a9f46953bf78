"""A hybrid model starts like megatron-core's MambaModel in Megatron-LM (``is_hybrid_model``).

Megatron-LM marks a hybrid run (``--is-hybrid-model`` at 0.16.1; main: any layer pattern) and
megatron-core then draws every layer's output projection (Mamba's ``out_proj``, attention's
``linear_proj``, the MLP's ``linear_fc2``) from N(0, std / sqrt(num_layers)), not the GPT
model's std / sqrt(2 num_layers). The reference is megatron-core's own
``TransformerConfig(is_hybrid_model=True).output_layer_init_method`` applied to a large tensor;
the model is built by pretrain_mamba.py's model provider (layout-invariant init).
"""

import pytest
import torch
from megatron.core.transformer import TransformerConfig

from megatron.varlen_training.config.from_flags import parse_hybrid_run_config
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import TINY_GPT_ARGS

STD = 0.05
LAYERS = 3
HYBRID = TINY_GPT_ARGS + ["--train-iters", "1", "--num-layers", str(LAYERS),
                          "--hybrid-override-pattern", "M*-", "--mamba-head-dim", "8",
                          "--mamba-num-groups", "2", "--init-method-std", str(STD)]
OUTPUT_PROJECTIONS = ("mixer.out_proj.weight", "self_attention.linear_proj.weight",
                      "mlp.linear_fc2.weight")
PROJECTION_INPUTS = ("mixer.in_proj.weight", "self_attention.linear_qkv.weight",
                     "mlp.linear_fc1.weight")
SAMPLE = 1_000_000  # entries of the reference draw: its std is exact to ~0.1%
TOLERANCE = 0.15  # the model's matrices have 2k-6k entries: their sample std within ~3%


def _model_stds(argv):
    """Sample std of each named weight of the model pretrain_mamba.py builds."""
    from megatron.core import parallel_state
    from megatron.varlen_training.hybrid_model import HYBRID as FAMILY
    from megatron.varlen_training.initialize import initialize_model_parallel, set_random_seeds

    run = parse_hybrid_run_config(argv, world_size=1)
    initialize_model_parallel(run.parallel)
    set_random_seeds(run.training.seed)
    try:
        config, chunks = FAMILY.model_provider(run)
        stds = {name: param.detach().float().std().item()
                for name, param in chunks[0].named_parameters()
                if name.endswith(OUTPUT_PROJECTIONS + PROJECTION_INPUTS)}
        return stds, config.is_hybrid_model
    finally:
        parallel_state.destroy_model_parallel()


def _megatron_core_std(is_hybrid_model: bool, which: str) -> float:
    config = TransformerConfig(num_layers=LAYERS, hidden_size=32, num_attention_heads=4,
                               init_method_std=STD, is_hybrid_model=is_hybrid_model)
    init = getattr(config, which)
    torch.manual_seed(0)
    return init(torch.empty(SAMPLE)).std().item()


def test_output_projections_start_as_megatron_cores_hybrid_model():
    (stds, is_hybrid), = run_distributed(_model_stds, 1, args=(HYBRID,), timeout_s=120)
    assert is_hybrid
    output = _megatron_core_std(True, "output_layer_init_method")
    inputs = _megatron_core_std(True, "init_method")
    assert output == pytest.approx(STD / LAYERS ** 0.5, rel=0.01)  # the rule it encodes
    for suffix in OUTPUT_PROJECTIONS:
        (std,) = [value for name, value in stds.items() if name.endswith(suffix)]
        assert std == pytest.approx(output, rel=TOLERANCE), (suffix, std, output)
    for suffix in PROJECTION_INPUTS:
        (std,) = [value for name, value in stds.items() if name.endswith(suffix)]
        assert std == pytest.approx(inputs, rel=TOLERANCE), (suffix, std, inputs)
