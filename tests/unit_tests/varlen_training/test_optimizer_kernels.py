"""optimizer_kernels.py's stand-ins compute what megatron-core's do, without host reads.

References: megatron-core's own local kernels (``megatron.core.utils``; its l2 norm's formula,
since it places the result on CUDA) and a float64 norm. The host reads themselves are counted
in test_step_host_reads.py.
"""

import pytest
import torch
from megatron.core import utils
from megatron.core.optimizer import clip_grads, optimizer

from megatron.varlen_training import optimizer_kernels
from megatron.varlen_training.optimizer_kernels import device_l2_norm, foreach_scale


def _tensors(seed=0, shapes=((3, 5), (7,), (2, 2, 4), (1,))):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen) * (i + 1) for i, shape in enumerate(shapes)]


def test_l2_norm_equals_megatron_core_and_float64():
    tensors = _tensors()
    ours, per_tensor = device_l2_norm(2048, None, [tensors], False)
    # megatron-core's local_multi_tensor_l2_norm, without its CUDA placement of the result.
    stock = torch.norm(torch.tensor([float(torch.norm(t)) for t in tensors]))
    exact = torch.cat([t.double().reshape(-1) for t in tensors]).norm()
    assert per_tensor is None and ours.shape == (1,) and ours.dtype == torch.float32
    assert torch.allclose(ours, stock, rtol=1e-6)
    assert abs(float(ours) - float(exact)) <= 1e-6 * float(exact)


def test_l2_norm_per_tensor():
    tensors = _tensors(seed=1)
    _, per_tensor = device_l2_norm(2048, None, [tensors], True)
    assert torch.allclose(per_tensor, torch.stack([t.norm() for t in tensors]))


def test_scale_is_bit_identical_to_megatron_core():
    sources = _tensors(seed=2)
    for scale in (1.0, 0.37):
        for dtype in (torch.float32, torch.bfloat16):
            ours = [torch.empty_like(s, dtype=dtype) for s in sources]
            stock = [torch.empty_like(s, dtype=dtype) for s in sources]
            foreach_scale(2048, None, [sources, ours], scale)
            utils.local_multi_tensor_scale(2048, None, [sources, stock], scale)
            assert all(torch.equal(a, b) for a, b in zip(ours, stock)), (scale, dtype)


def test_install_replaces_only_the_local_stand_ins(monkeypatch):
    monkeypatch.setattr(clip_grads, "l2_norm_impl", utils.local_multi_tensor_l2_norm)
    monkeypatch.setattr(clip_grads, "multi_tensor_scale_impl", utils.local_multi_tensor_scale)
    monkeypatch.setattr(optimizer, "multi_tensor_scale_impl", utils.local_multi_tensor_scale)
    assert optimizer_kernels.install()
    assert clip_grads.l2_norm_impl is device_l2_norm
    assert clip_grads.multi_tensor_scale_impl is foreach_scale
    assert optimizer.multi_tensor_scale_impl is foreach_scale
    assert not optimizer_kernels.install()  # idempotent
    apex_kernel = object()  # with Apex or TE installed their fused kernels stay
    monkeypatch.setattr(clip_grads, "l2_norm_impl", apex_kernel)
    optimizer_kernels.install()
    assert clip_grads.l2_norm_impl is apex_kernel


class _Wrapper:  # megatron-core's optimizers keep torch's in .optimizer
    def __init__(self, inner):
        self.optimizer = inner


def test_fused_adam_only_for_cuda_parameters():
    adam = torch.optim.AdamW([torch.nn.Parameter(torch.ones(3))], lr=0.1)
    assert optimizer_kernels.use_fused_adam(_Wrapper(adam)) == 0
    assert adam.param_groups[0]["fused"] is None  # CPU: torch's default implementation


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_adam_on_cuda_matches_foreach():
    params = [torch.nn.Parameter(t.cuda()) for t in _tensors(seed=3)]
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    fused, plain = (torch.optim.AdamW(ps, lr=0.01, foreach=True) for ps in (params, twins))
    for step in range(3):
        for opt, ps in ((fused, params), (plain, twins)):
            for p in ps:
                p.grad = torch.ones_like(p) * (step + 1)
            opt.step()
        if step == 0:  # switch after the first step: the step counters move to the GPU
            assert optimizer_kernels.use_fused_adam(_Wrapper(fused)) == 1
    assert fused.param_groups[0]["fused"] and fused.state[params[0]]["step"].is_cuda
    for a, b in zip(params, twins):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-7)
