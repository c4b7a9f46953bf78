"""The device is an explicit choice: CPU-designed runs stay on CPU even where CUDA is visible.

On this CPU-only CI machine CUDA visibility is faked with monkeypatch; on a GPU machine the
harness tests below check the real thing (ranks on CPU, CUDA never initialised).
"""

import os
import subprocess
import sys

import pytest
import torch

from megatron.varlen.platform import cpu_device
from tests.harness import multirank
from tests.harness.child_env import gpu_child_env
from tests.harness.multirank import run_distributed


@pytest.fixture
def cuda_visible(monkeypatch):
    """torch says a GPU is there (it is not: nothing may actually touch CUDA)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    yield
    cpu_device.deactivate()


def test_cuda_visible_and_not_forced_means_gpu(cuda_visible):
    assert not cpu_device.use_cpu()
    assert cpu_device.get_backend() == "nccl"
    assert cpu_device.activate() is False  # no redirects on a real GPU run


def test_forced_cpu_wins_over_a_visible_gpu(cuda_visible):
    cpu_device.force_cpu()
    assert cpu_device.activate() is True
    assert cpu_device.use_cpu() and cpu_device.get_backend() == "gloo"
    assert cpu_device.get_device() == torch.device("cpu")
    # Everything that asks (megatron-core, our spec, the TE adapter) must hear "no CUDA".
    assert torch.cuda.is_available() is False
    assert torch.empty(2, device="cuda").device.type == "cpu"
    cpu_device.deactivate()
    assert torch.cuda.is_available() is True and not cpu_device.use_cpu()


def test_cpu_rank_setup_hides_gpus_and_uses_gloo(cuda_visible, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert multirank.prepare_rank_device("cpu", rank=1) == "gloo"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""
    assert cpu_device.use_cpu() and torch.cuda.is_available() is False


def test_bad_device_is_refused():
    with pytest.raises(ValueError, match="'tpu'"):
        multirank.check_device("tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only check")
def test_cuda_ranks_need_a_gpu():
    with pytest.raises(ValueError, match="needs a visible CUDA device"):
        run_distributed(_what_the_rank_sees, 2, device="cuda")


def _what_the_rank_sees():
    return {
        "use_cpu": cpu_device.use_cpu(),
        "cuda_available": torch.cuda.is_available(),
        "cuda_initialized": torch.cuda.is_initialized(),
        "backend": torch.distributed.get_backend(),
        "hidden": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


def test_default_ranks_run_on_cpu_whatever_the_machine_has():
    for seen in run_distributed(_what_the_rank_sees, 2, timeout_s=60):
        assert seen == {"use_cpu": True, "cuda_available": False, "cuda_initialized": False,
                        "backend": "gloo", "hidden": ""}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="meaningful only with CUDA visible")
def test_forkserver_preload_does_not_initialise_cuda():
    # A CUDA context in the forkserver would break every forked rank ("Cannot re-initialize
    # CUDA in forked subprocess").
    code = ("import importlib, torch; from tests.harness import multirank; "
            "[importlib.import_module(m) for m in multirank._PRELOAD]; "
            "print(torch.cuda.is_initialized())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=gpu_child_env())  # the child must see the GPU for this to mean much
    assert out.stdout.strip().splitlines()[-1] == "False"


# --- --attention-backend resolution (accelerator) -----------------------------------------------

from megatron.varlen.platform import accelerator  # noqa: E402


@pytest.fixture
def gpu_with_flash(cuda_visible, monkeypatch):
    monkeypatch.setattr(accelerator, "flash_varlen_available", lambda: True)
    monkeypatch.setattr(accelerator, "te_available", lambda: False)


@pytest.mark.parametrize("dtype, dropout, expected", [
    (torch.bfloat16, 0.0, "flash"), (torch.float16, 0.0, "flash"),
    (torch.float32, 0.0, "local"),   # FlashAttention takes half precision only
    (torch.bfloat16, 0.1, "local"),  # and has no dropout: auto keeps the exact reference
])
def test_auto_on_cuda_without_te(gpu_with_flash, dtype, dropout, expected):
    assert accelerator.resolve_attention_backend("auto", dtype, dropout) == expected


def test_auto_prefers_te_then_falls_back_to_local_on_cpu(gpu_with_flash, monkeypatch):
    monkeypatch.setattr(accelerator, "te_available", lambda: True)
    assert accelerator.resolve_attention_backend("auto", torch.float32, 0.1) == "te"
    cpu_device.force_cpu()
    cpu_device.activate()
    monkeypatch.setattr(accelerator, "te_available", lambda: False)
    monkeypatch.setattr(accelerator, "flash_varlen_available", lambda: False)
    assert accelerator.resolve_attention_backend("auto", torch.bfloat16, 0.0) == "local"


def test_startup_line_says_why_auto_passed_over_flash(gpu_with_flash):
    line = accelerator.describe_attention_backend("auto", torch.bfloat16, 0.1)
    assert line == ("local (--attention-backend auto); not flash: --attention-dropout 0.1 > 0 "
                    "(flash has no dropout)")
    assert accelerator.describe_attention_backend("auto", torch.bfloat16, 0.0) == \
        "flash (--attention-backend auto)"


@pytest.mark.parametrize("softmax_type", ["off-by-one", "learnable"])
def test_an_attention_sink_keeps_auto_on_local_and_refuses_flash(gpu_with_flash, softmax_type):
    """torch's varlen_attn has no sink: auto takes the local attention and says why."""
    assert accelerator.describe_attention_backend("auto", torch.bfloat16, 0.0, softmax_type) == (
        f"local (--attention-backend auto); not flash: --softmax-type {softmax_type} (flash "
        f"has no attention sink)")
    with pytest.raises(ValueError, match=f"--softmax-type {softmax_type}.*--attention-backend "
                                         f"local"):
        accelerator.resolve_attention_backend("flash", torch.bfloat16, 0.0, softmax_type)


def test_explicit_flash_errors_name_the_flag(gpu_with_flash):
    with pytest.raises(ValueError, match="--attention-backend flash on CUDA needs --bf16"):
        accelerator.resolve_attention_backend("flash", torch.float32, 0.0)
    with pytest.raises(ValueError, match="--attention-dropout 0.1"):
        accelerator.resolve_attention_backend("flash", torch.bfloat16, 0.1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only check")
def test_flash_on_cpu_runs_the_kernel_twin_in_any_dtype():
    # On CPU "flash" is allowed (tests, debugging): its kernel is the plain-torch twin.
    assert accelerator.resolve_attention_backend("flash", torch.float32, 0.0) == "flash"
    assert not accelerator.flash_varlen_available()
    assert not accelerator.bias_dropout_add_fusion_keeps_numbers()  # CPU: nothing fused


@pytest.mark.parametrize("requested", ["fused", "unfused"])
def test_megatron_lms_te_kernel_names_run_as_te(gpu_with_flash, monkeypatch, requested):
    """Megatron-LM's recipes pass --attention-backend fused (TE's cuDNN kernel): te here, and
    the same one-line refusal as te where Transformer Engine cannot run."""
    with pytest.raises(ValueError, match=f"--attention-backend {requested} needs Transformer"):
        accelerator.resolve_attention_backend(requested, torch.bfloat16, 0.0)
    monkeypatch.setattr(accelerator, "te_available", lambda: True)
    assert accelerator.resolve_attention_backend(requested, torch.bfloat16, 0.0) == "te"
