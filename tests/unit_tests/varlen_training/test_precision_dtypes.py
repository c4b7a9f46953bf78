"""Under --bf16 the model's parameters, its main grads and the optimizer's master weights and
Adam moments have Megatron-LM's dtypes, read off the built model and optimizer (one CPU rank).

Reference (Megatron-LM core_v0.16.1 facts, not our code): ``validate_args`` sets
``params_dtype = bfloat16`` and, for bf16, ``accumulate_allreduce_grads_in_fp32 = True``, which
becomes DDP's ``grad_reduce_in_fp32`` (main grads in fp32); the optimizer without
``--use-precision-aware-optimizer`` keeps fp32 master copies of the bf16 weights
(``Float16OptimizerWithFloat16Params``, or the distributed optimizer's fp32 shards) and fp32 Adam
moments. Without --bf16 everything is fp32 and no copy is made. With --fp16 the gradients stay
fp16 unless --accumulate-allreduce-grads-in-fp32 (Megatron-LM's default for fp16 is off); fp16
runs need CUDA, so here the flags are parsed as if a GPU were present and only the built model
and one optimizer step are read.
"""

from __future__ import annotations

import contextlib
from unittest import mock

import pytest
import torch

from tests.harness.multirank import run_distributed
from tests.harness.training_runs import TINY_GPT_ARGS

ARGV = TINY_GPT_ARGS + ["--train-iters", "1"]
VARIANTS = {
    "fp32": [],
    "bf16": ["--bf16"],
    "bf16_distributed_optimizer": ["--bf16", "--use-distributed-optimizer"],
    "fp16": ["--fp16"],
    "fp16_grads_in_fp32": ["--fp16", "--accumulate-allreduce-grads-in-fp32"],
}


def _dtypes_of(extra: list[str]) -> dict:
    """Dtypes of the model's weights, main grads, the optimizer's master weights (the params
    its Adam steps) and Adam moments after one step."""
    from megatron.core import parallel_state as ps
    from megatron.varlen_training.config.from_flags import parse_run_config
    from megatron.varlen_training.initialize import initialize_model_parallel, set_random_seeds
    from megatron.varlen_training.model import build_model, build_transformer_config
    from megatron.varlen_training.training import build_optimizer

    pretend_gpu = (mock.patch.object(torch.cuda, "is_available", lambda: True)
                   if "--fp16" in extra else contextlib.nullcontext())
    with pretend_gpu:  # the parse only: the model is built and stepped on the CPU
        run = parse_run_config(ARGV + extra, world_size=1)
    initialize_model_parallel(run.parallel)
    set_random_seeds(run.training.seed)
    try:
        model = build_model(run, build_transformer_config(run))
        optimizer = build_optimizer(run, model)
        weights = [p for chunk in model for p in chunk.parameters()]
        for param in weights:  # a gradient to step on
            param.main_grad.fill_(1e-3)
        optimizer.step()
        adam = [inner for inner in optimizer.chained_optimizers]
        stepped = [p for opt in adam for group in opt.optimizer.param_groups
                   for p in group["params"]]
        moments = [opt.optimizer.state[p][key] for opt in adam for p in stepped
                   if p in opt.optimizer.state for key in ("exp_avg", "exp_avg_sq")]
        return {
            "weights": {p.dtype for p in weights},
            "main_grads": {p.main_grad.dtype for p in weights},
            "master": {p.dtype for p in stepped},
            "moments": {m.dtype for m in moments},
            "master_is_a_copy": not any(p is w for p in stepped for w in weights),
        }
    finally:
        ps.destroy_model_parallel()


def _all_variants() -> dict:
    return {name: _dtypes_of(extra) for name, extra in VARIANTS.items()}


@pytest.fixture(scope="module")
def dtypes():
    return run_distributed(_all_variants, 1, timeout_s=180)[0]


def test_fp32_run_keeps_everything_in_fp32(dtypes):
    got = dtypes["fp32"]
    assert got["weights"] == got["main_grads"] == got["master"] == got["moments"] == {
        torch.float32}
    assert not got["master_is_a_copy"]  # Megatron-LM's FP32Optimizer steps the weights


@pytest.mark.parametrize("variant", ["bf16", "bf16_distributed_optimizer"])
def test_bf16_has_megatron_lms_dtypes(dtypes, variant):
    got = dtypes[variant]
    assert got["weights"] == {torch.bfloat16}
    assert got["main_grads"] == {torch.float32}  # accumulate/all-reduce grads in fp32
    assert got["master"] == {torch.float32}      # fp32 master weights ...
    assert got["master_is_a_copy"]               # ... kept beside the bf16 weights
    assert got["moments"] == {torch.float32}


@pytest.mark.parametrize("variant, grads", [("fp16", torch.float16),
                                            ("fp16_grads_in_fp32", torch.float32)])
def test_fp16_has_megatron_lms_dtypes(dtypes, variant, grads):
    got = dtypes[variant]
    assert got["weights"] == {torch.float16}
    assert got["main_grads"] == {grads}
    assert got["master"] == got["moments"] == {torch.float32}
    assert got["master_is_a_copy"]


def test_start_up_names_the_parameters_dtype_as_megatron_lm():
    """Megatron-LM's validate_args prints 'using {params_dtype} for parameters ...'."""
    from megatron.varlen_training.config.from_flags import parse_run_config
    from megatron.varlen_training.initialize import parameters_dtype_line

    for extra, dtype in (([], torch.float32), (["--bf16"], torch.bfloat16)):
        model = parse_run_config(ARGV + extra, world_size=1).model
        assert parameters_dtype_line(model) == "using {} for parameters ...".format(dtype)
