"""The same --seed gives the same FULL weights in every layout (TP, PP, tied output layer).

Each rank returns its shards keyed by the layout-free parameter name; the test reassembles the
full tensors (concatenating TP shards along their partition dim) and compares them with the
single-rank model's, parameter by parameter.
"""

import pytest
import torch

from tests.harness.multirank import run_distributed
from tests.harness.training_runs import TINY_GPT_ARGS

ARGV = TINY_GPT_ARGS + ["--train-iters", "1", "--num-layers", "4", "--swiglu",
                        "--ffn-hidden-size", "64",
                        "--position-embedding-type", "rope"]


def _shards(argv):
    from megatron.core import parallel_state as ps
    from megatron.varlen_training.config.from_flags import parse_run_config
    from megatron.varlen_training.initialize import initialize_model_parallel, set_random_seeds
    from megatron.varlen_training.layout_invariant_init import canonical_parameter_name
    from megatron.varlen_training.model import build_model, build_transformer_config, unwrap

    run = parse_run_config(argv, world_size=torch.distributed.get_world_size())
    initialize_model_parallel(run.parallel)
    set_random_seeds(run.training.seed)
    try:
        out = {}
        for chunk in build_model(run, build_transformer_config(run)):
            module = unwrap(chunk)
            for name, param in module.named_parameters():
                key = canonical_parameter_name(module, name, tied_output=True)
                split = getattr(param, "tensor_model_parallel", False)
                dim = param.partition_dim if split else None
                out[key] = (ps.get_tensor_model_parallel_rank(), dim, param.detach().clone())
        return out
    finally:
        ps.destroy_model_parallel()


def _full_weights(results):
    pieces = {}
    for rank_result in results:
        for key, (tp_rank, dim, shard) in rank_result.items():
            pieces.setdefault(key, {})[tp_rank] = (dim, shard)
    full = {}
    for key, by_rank in pieces.items():
        dim = by_rank[0][0]
        shards = [by_rank[r][1] for r in sorted(by_rank)]
        if dim is None or len(shards) == 1:
            full[key] = shards[0]
        elif key.endswith("linear_fc1.weight"):  # SwiGLU: each rank holds [gate_r; up_r]
            halves = [s.chunk(2, dim) for s in shards]
            full[key] = torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim)
        else:
            full[key] = torch.cat(shards, dim)
    return full


@pytest.fixture(scope="module")
def reference():
    return _full_weights(run_distributed(_shards, 1, args=(ARGV,), timeout_s=120))


@pytest.mark.parametrize("layout", [["--tensor-model-parallel-size", "2"],
                                    ["--pipeline-model-parallel-size", "2"],
                                    ["--pipeline-model-parallel-size", "2",
                                     "--num-layers-per-virtual-pipeline-stage", "1"]],
                         ids=["tp2", "pp2", "pp2_vpp2"])
def test_full_weights_equal_single_rank(reference, layout):
    full = _full_weights(run_distributed(_shards, 2, args=(ARGV + layout,), timeout_s=120))
    assert set(full) == set(reference), sorted(set(full) ^ set(reference))
    for key, tensor in reference.items():
        assert torch.equal(full[key], tensor), f"{layout}: {key} differs"
    assert any(t.abs().sum() > 0 for t in reference.values())  # not all zeros
