"""Features built without a GPU, each on a real GPU against its CPU run (one GPU, fp32, local
attention, the same layout-invariant weights):

* MoE, packed: megatron-core's MoELayer with plain-torch experts, seq_aux_loss and z-loss per real
  packed sequence (lm loss and both balancing losses);
* activation recomputation, full and selective: == the run without it on the GPU (it replays
  the CUDA RNG tracker there, which the CPU runs stub);
* Megatron-LM's fixed THD shapes (--pad-packed-seq-alignment max, --thd-max-packed-sequences,
  the shapes CUDA graphs need): == variable shapes.

One rank each: multi-rank layouts of these paths are CPU-verified (tests/unit_tests); on one GPU
more ranks would share it over gloo. Run with `pytest -m gpu tests/gpu` (tools/gpu_check.py runs
this directory); skipped without CUDA. `_compare(..., device="cpu")` runs the same comparisons
on CPU, which is how they were checked before any GPU was lent.
"""

import pytest
import torch

from tests.harness.multirank import run_distributed
from tests.harness.training_runs import loss_owner_history, train_on_this_rank
from tests.unit_tests.varlen_training import test_moe_equivalence as moe
from tests.unit_tests.varlen_training.test_packing_equivalence import PACKED, RTOL

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
RUN_TIMEOUT_S = 200
LOCAL = ["--attention-backend", "local"]
MOE_PACKED = moe.GPT + moe.PACKED + LOCAL
MOE_METRICS = ("lm_loss", "seq_load_balancing_loss", "z_loss")
FULL_RECOMPUTE = ["--recompute-granularity", "full", "--recompute-method", "uniform",
                  "--recompute-num-layers", "1"]
SELECTIVE_RECOMPUTE = ["--recompute-granularity", "selective"]
FIXED_SHAPES = ["--pad-packed-seq-alignment", "max", "--thd-max-packed-sequences", "4"]


def _history(argv, device):
    results = run_distributed(train_on_this_rank, 1, args=(argv,), timeout_s=RUN_TIMEOUT_S,
                              device=device)
    return loss_owner_history(results)


def _compare(argv, reference_argv, reference_device, metrics=("lm_loss",), device="cuda"):
    """``argv`` on ``device`` against ``reference_argv`` on ``reference_device``, iteration by
    iteration, within the fp32 tolerance of the equivalence tests."""
    got, want = _history(argv, device), _history(reference_argv, reference_device)
    assert len(got) == len(want) > 0
    for it, (g, w) in enumerate(zip(got, want), start=1):
        for metric in metrics:
            assert abs(g[metric] - w[metric]) <= RTOL * abs(w[metric]), (
                f"iteration {it} {metric}: {device} {g[metric]!r} vs {reference_device} "
                f"{w[metric]!r}")


def test_moe_packed_on_gpu_equals_cpu():
    _compare(MOE_PACKED, MOE_PACKED, "cpu", MOE_METRICS)


@pytest.mark.parametrize("recompute", [FULL_RECOMPUTE, SELECTIVE_RECOMPUTE],
                         ids=["full", "selective"])
def test_recomputation_on_gpu_equals_none(recompute):
    _compare(PACKED + LOCAL + recompute, PACKED + LOCAL, "cuda")


def test_fixed_thd_shapes_on_gpu_equal_variable_shapes_on_cpu():
    _compare(PACKED + LOCAL + FIXED_SHAPES, PACKED + LOCAL, "cpu")
