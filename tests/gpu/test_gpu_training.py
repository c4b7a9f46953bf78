"""Training on a real GPU equals training on CPU.

* single GPU, fp32: the losses of the CPU run (1e-5), with the same layout-invariant weights;
* packed == unpacked on the GPU;
* DP2 packed and DP2 x CP2 dynamic CP with ranks SHARING one GPU over gloo with CUDA tensors
  (the harness's device="cuda"; gradients reduced one bucket at a time, megatron/varlen/
  gloo_cuda.py): the CPU run's losses. fp32 with the local attention (tight), and bf16 with the
  flash backend against the fp32 CPU run (bf16 tolerance). PP stays CPU-verified: gloo has no
  send/recv for CUDA tensors. (Sync counts are test_gpu_benchmark.py's: over gloo every
  collective on CUDA tensors goes through the host.)

Run with `pytest -m gpu tests/gpu`; skipped without CUDA. Each test fits well inside one GPU
command (10 minutes); the CPU reference runs are shared per module.
"""

import pytest
import torch

from tests.harness.multirank import run_distributed
from tests.harness.training_runs import loss_owner_history, train_on_this_rank
from tests.unit_tests.varlen_training.test_packing_equivalence import PACKED, RTOL, UNPACKED

# A few multi-rank launches per test (spawned ranks import torch and megatron-core afresh).
pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
RUN_TIMEOUT_S = 200

LOCAL = ["--attention-backend", "local"]
DYNAMIC_DP2_CP2 = PACKED + ["--dynamic-context-parallel", "--context-parallel-size", "2",
                            "--max-seqlen-per-dp-cp-rank", "16"]
BF16_RTOL = 2e-2


def _losses(argv, world, device):
    results = run_distributed(train_on_this_rank, world, args=(argv,), timeout_s=RUN_TIMEOUT_S,
                              device=device)
    return [h["lm_loss"] for h in loss_owner_history(results)]


@pytest.fixture(scope="module")
def cpu_losses():
    """The unpacked CPU run per world size, computed once per module (per xdist worker)."""
    cache = {}

    def get(world):
        if world not in cache:
            cache[world] = _losses(UNPACKED + LOCAL, world, "cpu")
        return cache[world]

    return get


def _assert_close(got, expected, rtol, what):
    assert len(got) == len(expected) > 0
    for it, (g, e) in enumerate(zip(got, expected), start=1):
        assert abs(g - e) <= rtol * abs(e), f"{what} iteration {it}: {g!r} vs {e!r}"


def _weights_and_devices(argv):
    from megatron.core import parallel_state as ps
    from megatron.varlen_training.config.from_flags import parse_run_config
    from megatron.varlen_training.initialize import initialize_model_parallel, set_random_seeds
    from megatron.varlen_training.model import build_model, build_transformer_config, unwrap

    run = parse_run_config(argv, world_size=1)
    initialize_model_parallel(run.parallel)
    set_random_seeds(run.training.seed)
    try:
        module = unwrap(build_model(run, build_transformer_config(run))[0])
        return {name: (str(p.device.type), p.detach().cpu()) for name, p in
                module.named_parameters()}
    finally:
        ps.destroy_model_parallel()


def test_weights_live_on_the_gpu_and_equal_the_cpu_initialisation():
    gpu = run_distributed(_weights_and_devices, 1, args=(UNPACKED,), device="cuda")[0]
    cpu = run_distributed(_weights_and_devices, 1, args=(UNPACKED,), device="cpu")[0]
    assert {d for d, _ in gpu.values()} == {"cuda"}
    for name, (_, tensor) in cpu.items():
        assert torch.equal(gpu[name][1], tensor), name


def test_single_gpu_fp32_losses_equal_cpu(cpu_losses):
    _assert_close(_losses(UNPACKED + LOCAL, 1, "cuda"), cpu_losses(1), RTOL, "single GPU vs CPU")


def test_packed_equals_unpacked_on_gpu():
    _assert_close(_losses(PACKED + LOCAL, 1, "cuda"), _losses(UNPACKED + LOCAL, 1, "cuda"),
                  RTOL, "packed vs unpacked (GPU)")


@pytest.mark.parametrize("argv, world", [(PACKED, 2), (DYNAMIC_DP2_CP2, 4)],
                         ids=["dp2_packed", "dp2_cp2_dynamic"])
def test_ranks_sharing_one_gpu_equal_the_cpu_run(cpu_losses, argv, world):
    cpu = cpu_losses(2)
    _assert_close(_losses(argv + LOCAL, world, "cuda"), cpu, RTOL, "GPU fp32 local vs CPU")
    flash = argv + ["--attention-backend", "flash", "--bf16"]
    _assert_close(_losses(flash, world, "cuda"), cpu, BF16_RTOL, "GPU bf16 flash vs CPU fp32")

