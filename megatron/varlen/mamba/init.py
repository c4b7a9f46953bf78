"""Layout-invariant initial values of the Mamba mixer's parameters (Mamba-2's init rules).

``training/layout_invariant_init.py`` draws every parameter as the FULL tensor from a generator
keyed by ``(seed, canonical name)`` and keeps this rank's TP shard. Mixer parameters need two things
more: Mamba's own rules (A = -uniform(1, 16) kept as log, dt_bias = softplus^-1 of a log-uniform
step in [dt_min, dt_max], D = 1, conv taps kaiming-uniform) instead of N(0, std), and a
SECTIONED TP shard -- the in-projection's rows are [z, x, B, C, dt] and the convolution's
channels [x, B, C], each section split over TP separately (a contiguous chunk of the whole
tensor would mix sections). :func:`mamba_parameter_shard` returns this rank's shard for a mixer
parameter, or None for any other parameter.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch

MIXER = ".mixer."
DT_MIN, DT_MAX, DT_FLOOR = 1e-3, 1e-1, 1e-4  # megatron-core's MambaMixer defaults
A_RANGE = (1.0, 16.0)


def _generator(seed_of: Callable[[str], int], name: str) -> torch.Generator:
    return torch.Generator().manual_seed(seed_of(name))


def _sections(mixer, what: str) -> list[int]:
    """Full (TP=1) section sizes along dim 0."""
    bc = mixer.ngroups * mixer.d_state
    if what == "in_proj":
        return [mixer.d_inner, mixer.d_inner, bc, bc, mixer.nheads]
    return [mixer.d_inner, bc, bc]  # conv1d channels


def _shard_sections(full: torch.Tensor, sections: list[int], tp_size: int, tp_rank: int):
    parts = torch.split(full, sections, dim=0)
    return torch.cat([part.chunk(tp_size, dim=0)[tp_rank] for part in parts], dim=0)


def _draw_full(suffix: str, mixer, shape: list[int], gen: torch.Generator, std: float,
               output_std: float) -> torch.Tensor:
    if suffix == "A_log":
        return torch.empty(shape, dtype=torch.float64).uniform_(*A_RANGE, generator=gen).log()
    if suffix == "dt_bias":
        log_dt = torch.rand(shape, generator=gen, dtype=torch.float64) * (
            math.log(DT_MAX) - math.log(DT_MIN)) + math.log(DT_MIN)
        dt = log_dt.exp().clamp(min=DT_FLOOR)
        return dt + torch.log(-torch.expm1(-dt))  # softplus^-1(dt)
    if suffix == "D":
        return torch.ones(shape, dtype=torch.float64)
    if suffix == "conv1d.weight":
        bound = 1.0 / math.sqrt(mixer.d_conv)  # kaiming_uniform(a=sqrt(5)), fan_in = width
        return torch.empty(shape, dtype=torch.float64).uniform_(-bound, bound, generator=gen)
    if suffix == "conv1d.bias":
        return torch.zeros(shape, dtype=torch.float64)
    if suffix == "out_proj.weight":
        std = output_std  # an output projection, as linear_proj/fc2
    return torch.randn(shape, generator=gen, dtype=torch.float64) * std


def mamba_parameter_shard(chunk: torch.nn.Module, name: str, canonical: str,
                          param: torch.Tensor, seed_of: Callable[[str], int], std: float,
                          output_std: float, tp_size: int, tp_rank: int
                          ) -> Optional[torch.Tensor]:
    """This rank's initial value of a mixer parameter (None: not a mixer parameter);
    ``output_std``: the output projection's (megatron-core's ``output_layer_init_method``)."""
    if MIXER not in name or name.endswith("norm.weight"):
        return None  # the gated norm's weight is a norm weight: ones, generic rule
    prefix, suffix = name.split(MIXER, 1)
    mixer = chunk.get_submodule(f"{prefix}{MIXER}".strip("."))
    shape = list(param.shape)
    split_dim = getattr(param, "partition_dim", 0)
    if getattr(param, "tensor_model_parallel", False) and tp_size > 1:
        shape[split_dim] *= tp_size
    full = _draw_full(suffix, mixer, shape, _generator(seed_of, canonical), std, output_std)
    if tp_size == 1 or not getattr(param, "tensor_model_parallel", False):
        return full
    if suffix == "in_proj.weight":
        return _shard_sections(full, _sections(mixer, "in_proj"), tp_size, tp_rank)
    if suffix.startswith("conv1d."):
        return _shard_sections(full, _sections(mixer, "conv1d"), tp_size, tp_rank)
    return full.chunk(tp_size, dim=split_dim)[tp_rank]
