"""Each redirect of the CPU device layer, in isolation (activate -> check -> deactivate)."""

import pytest
import torch

from megatron.varlen.platform import cpu_device

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU layer is off on GPU")


@pytest.fixture
def active():
    assert cpu_device.activate()
    yield
    cpu_device.deactivate()


def test_factory_functions_land_on_cpu(active):
    assert torch.empty(3, device="cuda").device.type == "cpu"
    assert torch.zeros(2, device=torch.device("cuda", 0)).device.type == "cpu"
    assert torch.ones(2, device=0).device.type == "cpu"  # a bare int is a CUDA ordinal


def test_tensor_moves_are_noops(active):
    t = torch.arange(4.0)
    assert t.cuda() is t
    assert t.to("cuda").device.type == "cpu"
    assert t.to(device="cuda:0").device.type == "cpu"
    assert t.pin_memory() is t
    assert torch.tensor([1, 2], pin_memory=True, device="cuda").device.type == "cpu"
    assert t.to(torch.float64).dtype == torch.float64  # non-device .to untouched


def test_type_string_reports_cuda_names(active):
    assert torch.zeros(1).type() == "torch.cuda.FloatTensor"
    assert torch.zeros(1, dtype=torch.bfloat16).type() == "torch.cuda.BFloat16Tensor"
    assert torch.zeros(1).type(torch.float64).dtype == torch.float64  # conversion untouched


def test_cuda_queries_answer_as_one_device(active):
    assert torch.cuda.current_device() == torch.device("cpu")
    assert torch.cuda.device_count() == 1
    torch.cuda.synchronize()  # must not raise


def test_rng_tracker_streams_are_named_and_reproducible(active):
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    tracker = get_cuda_rng_tracker()
    tracker.reset()
    tracker.add("a", 11)
    tracker.add("b", 12)
    outer_before = torch.get_rng_state()
    with tracker.fork("a"):
        a1 = torch.rand(3)
    with tracker.fork("a"):
        a2 = torch.rand(3)
    with tracker.fork("b"):
        b1 = torch.rand(3)
    assert torch.equal(torch.get_rng_state(), outer_before), "fork must restore the outer state"
    assert not torch.equal(a1, a2), "a forked stream advances between forks"
    assert not torch.equal(a1, b1)
    expected = torch.Generator().manual_seed(11)
    assert torch.equal(a1, torch.rand(3, generator=expected))
    with pytest.raises(ValueError, match="seed 11"):
        tracker.add("c", 11)


def test_deactivate_restores_everything():
    original = torch.cuda.current_device
    cpu_device.activate()
    cpu_device.deactivate()
    assert torch.cuda.current_device is original
    assert torch.zeros(1).type() == "torch.FloatTensor"


def test_allocations_inside_autograd_backward_land_on_cpu(active):
    # Function modes are off inside autograd.Function.backward; megatron's sequence-parallel
    # backward allocates with device=torch.cuda.current_device() there.
    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            buffer = torch.empty(grad.shape, device=torch.cuda.current_device())
            return buffer.copy_(grad * 2)

    x = torch.ones(3, requires_grad=True)
    Double.apply(x).sum().backward()
    assert x.grad.tolist() == [2.0, 2.0, 2.0]
