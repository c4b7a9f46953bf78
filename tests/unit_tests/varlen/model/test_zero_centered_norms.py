"""--apply-layernorm-1p (megatron-core's ``layernorm_zero_centered_gamma``): the norm stores
gamma - 1, starts at zeros, and computes what the plain norm computes with weight = stored + 1.

Reference: torch's own LayerNorm / RMSNorm modules, in float64, with the weight set to the
zero-centered norm's stored weight + 1; outputs and the weight/bias/input gradients agree.
"""

from types import SimpleNamespace

import pytest
import torch

from megatron.varlen.model.norms import VarlenNorm

HIDDEN = 8
EPS = 1e-5
TOL = dict(rtol=1e-12, atol=1e-12)  # float64: the same arithmetic but for one addition


def _config(normalization: str, zero_centered: bool) -> SimpleNamespace:
    return SimpleNamespace(normalization=normalization, sequence_parallel=False,
                           layernorm_zero_centered_gamma=zero_centered)


@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
def test_zero_centered_norm_equals_plain_norm_with_weight_plus_one(normalization):
    centered = VarlenNorm(_config(normalization, True), HIDDEN, eps=EPS).double()
    plain = VarlenNorm(_config(normalization, False), HIDDEN, eps=EPS).double()
    assert type(plain) in (torch.nn.LayerNorm, torch.nn.RMSNorm)  # the independent reference
    assert torch.count_nonzero(centered.weight) == 0  # stored gamma - 1 starts at 0
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        centered.weight.copy_(torch.randn(HIDDEN, generator=generator, dtype=torch.float64))
        plain.weight.copy_(centered.weight + 1)
        if normalization == "LayerNorm":
            centered.bias.copy_(torch.randn(HIDDEN, generator=generator, dtype=torch.float64))
            plain.bias.copy_(centered.bias)
    x = torch.randn(3, 5, HIDDEN, generator=generator, dtype=torch.float64)
    inputs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    outputs = [centered(inputs[0]), plain(inputs[1])]
    torch.testing.assert_close(outputs[0], outputs[1], **TOL)
    upstream = torch.randn(outputs[0].shape, generator=generator, dtype=torch.float64)
    for output in outputs:
        output.backward(upstream)
    torch.testing.assert_close(inputs[0].grad, inputs[1].grad, **TOL)
    for name, param in centered.named_parameters():
        torch.testing.assert_close(param.grad, getattr(plain, name).grad, **TOL)


@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
def test_norm_keyword_alone_asks_for_zero_centered_gamma(normalization):
    """megatron-core's norms take ``zero_centered_gamma`` as a keyword too."""
    config = _config(normalization, False)
    norm = VarlenNorm(config, HIDDEN, eps=EPS, zero_centered_gamma=True)
    assert norm.zero_centered_gamma and torch.count_nonzero(norm.weight) == 0
    assert not getattr(VarlenNorm(config, HIDDEN, eps=EPS), "zero_centered_gamma", False)
    assert [name for name, _ in norm.named_parameters()] == [
        name for name, _ in VarlenNorm(config, HIDDEN, eps=EPS).named_parameters()]
