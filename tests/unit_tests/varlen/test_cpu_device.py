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


def test_cuda_streams_are_one_cpu_stream(active):
    """megatron-core's MoE all-to-all dispatcher makes a side stream for its host copies."""
    side = torch.cuda.Stream()
    assert torch.cuda.current_stream() is side  # one stream: no side-stream bookkeeping
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        side.record_event().synchronize()
    assert isinstance(torch.cuda.Stream | None, object)  # transformers annotates with it


def test_moe_dispatcher_host_copies_are_numpy(active):
    from megatron.core.transformer.moe import token_dispatcher

    splits = token_dispatcher.maybe_move_tensor_to_cpu(torch.tensor([3, 1]), as_numpy=True)
    assert splits.tolist() == [3, 1] and not torch.is_tensor(splits)
    kept = torch.tensor([2])
    assert token_dispatcher.maybe_move_tensor_to_cpu(kept) is kept


def _uneven_gather_round_trip():
    from megatron.core.tensor_parallel import mappings

    cpu_device.activate()
    rank = torch.distributed.get_rank()
    group = torch.distributed.new_group([0, 1])
    sizes = [2, 3]
    local = torch.full((sizes[rank], 2), float(rank + 1), requires_grad=True)
    gathered = mappings._gather_along_first_dim(local, group, output_split_sizes=sizes)
    scattered = mappings._reduce_scatter_along_first_dim(gathered * 10, group,
                                                         input_split_sizes=sizes)
    return gathered.tolist(), scattered.tolist()


def test_uneven_gather_and_reduce_scatter_over_gloo():
    from tests.harness.multirank import run_distributed

    results = run_distributed(_uneven_gather_round_trip, 2, timeout_s=120)
    expected_gather = [[1.0, 1.0]] * 2 + [[2.0, 2.0]] * 3
    assert all(gathered == expected_gather for gathered, _ in results)
    # each rank keeps its rows of the sum over the 2 ranks of 10 x the gathered tensor
    assert results[0][1] == [[20.0, 20.0]] * 2 and results[1][1] == [[40.0, 40.0]] * 3
