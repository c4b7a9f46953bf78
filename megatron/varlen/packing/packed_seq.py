"""A micro-batch's boundaries as the packing layer knows them: on the device AND on the host.

:class:`VarlenPackedSeqParams` is megatron-core's ``PackedSeqParams`` with two declared additions,
set by the packing layer (:func:`megatron.varlen.packing.thd_microbatch.build_model_inputs`) where
the boundaries are still host values the schedule made:

* ``host_cu_seqlens`` / ``host_cu_seqlens_padded``: [n+1] int32 CPU copies of the real and padded
  boundaries of the WHOLE pack;
* ``derived``: a :class:`MicroBatchCache` of what the layers build from them once per
  micro-batch (attention plans and layouts, Mamba's CP permutations and ``seq_idx``, the host
  view RoPE reads), shared by every layer.

Being dataclass fields, both travel with ``dataclasses.replace`` and ``copy.copy`` (which share
the cache), so no layer reads the boundaries back from the device. A plain ``PackedSeqParams``
made elsewhere still works: :func:`host_boundaries` reads its boundaries back, once per call.

:func:`host_to_device` is how the data path moves host tensors: pinned, asynchronous on CUDA.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from megatron.core.packed_seq_params import PackedSeqParams
from megatron.varlen.platform.host_syncs import as_device_copy

_HOST_VIEW = "host-view"  # kind of the cached view whose boundaries are the host copies


class MicroBatchCache:
    """What the layers derive from one micro-batch's boundaries, each built on first use.

    Keys are tuples whose first entry names the kind (e.g. ``("attention-plan", cp_size,
    cp_rank, causal, device)``); ``build`` must read only host values.
    """

    def __init__(self):
        self._entries: dict[tuple, Any] = {}

    def get(self, key: tuple, build: Callable[[], Any]) -> Any:
        """``build()`` for ``key``, built once per micro-batch."""
        if key not in self._entries:
            self._entries[key] = build()
        return self._entries[key]

    def __len__(self) -> int:
        return len(self._entries)


@dataclass
class VarlenPackedSeqParams(PackedSeqParams):
    """``PackedSeqParams`` plus the host copies of its boundaries and the micro-batch cache."""

    host_cu_seqlens: Optional[torch.Tensor] = None         # [n+1] int32, CPU, real lengths
    host_cu_seqlens_padded: Optional[torch.Tensor] = None  # [n+1] int32, CPU, padded lengths
    derived: MicroBatchCache = field(default_factory=MicroBatchCache)
    # [n] int64, CPU: real tokens per sequence with pad-only fillers at 0 (MoE routing counts).
    host_routed_lengths: Optional[torch.Tensor] = None


@dataclass(frozen=True)
class HostBoundaries:
    """The host boundaries of a micro-batch and its cache (what :func:`host_boundaries` gives)."""

    cu_seqlens: torch.Tensor         # [n+1] int32, CPU
    cu_seqlens_padded: torch.Tensor  # [n+1] int32, CPU
    cache: MicroBatchCache


def on_host(cu: torch.Tensor) -> torch.Tensor:
    """``cu`` as a host int32 tensor (itself when it already is one: no copy)."""
    if cu.device.type == "cpu" and cu.dtype == torch.int32 and not cu.requires_grad:
        return cu
    return cu.detach().to("cpu", torch.int32)


def varlen_packed_seq_params(cu_seqlens: torch.Tensor, cu_seqlens_padded: torch.Tensor,
                             host_cu_seqlens: torch.Tensor, host_cu_seqlens_padded: torch.Tensor,
                             max_seqlen: int, local_cp_size: int,
                             cp_group=None, routed_lengths: torch.Tensor | None = None
                             ) -> VarlenPackedSeqParams:
    """THD params of one micro-batch: device boundaries for megatron-core (and TE), host ones
    for our layers; q and kv share the boundaries (self-attention). ``routed_lengths``: the
    pack's per-sequence real tokens with fillers at 0 (MoE routing statistics)."""
    return VarlenPackedSeqParams(
        qkv_format="thd", cu_seqlens_q=cu_seqlens, cu_seqlens_kv=cu_seqlens,
        cu_seqlens_q_padded=cu_seqlens_padded, cu_seqlens_kv_padded=cu_seqlens_padded,
        max_seqlen_q=max_seqlen, max_seqlen_kv=max_seqlen, local_cp_size=local_cp_size,
        cp_group=cp_group, host_cu_seqlens=on_host(host_cu_seqlens),
        host_cu_seqlens_padded=on_host(host_cu_seqlens_padded),
        host_routed_lengths=routed_lengths)


def has_host_boundaries(params) -> bool:
    """Whether ``params`` carries the host copies of its boundaries (made by the packing layer)."""
    return isinstance(params, VarlenPackedSeqParams) and params.host_cu_seqlens is not None


def as_varlen(params: PackedSeqParams) -> VarlenPackedSeqParams:
    """``params`` itself when it carries host boundaries; else a copy that does, read back from
    the device ONCE (for params built outside the packing layer, e.g. by a test or TE path)."""
    if has_host_boundaries(params):
        return params
    padded = params.cu_seqlens_q if params.cu_seqlens_q_padded is None \
        else params.cu_seqlens_q_padded
    fields = {f.name: getattr(params, f.name) for f in dataclasses.fields(PackedSeqParams)}
    return VarlenPackedSeqParams(**fields, host_cu_seqlens=on_host(params.cu_seqlens_q),
                                 host_cu_seqlens_padded=on_host(padded))


def host_boundaries(params: PackedSeqParams) -> HostBoundaries:
    """The host boundaries and cache of ``params`` (read back from the device when it has no
    host copies: see :func:`as_varlen`)."""
    params = as_varlen(params)
    return HostBoundaries(params.host_cu_seqlens, params.host_cu_seqlens_padded, params.derived)


def with_host_boundaries(params: PackedSeqParams) -> PackedSeqParams:
    """A copy of ``params`` whose ``cu_seqlens*`` ARE the host copies, or ``params`` itself
    when it has none; one copy per micro-batch and CP group, shared by every layer.

    megatron-core's THD RoPE reads the boundaries with ``.tolist()`` in every layer; handed
    host tensors, that is no device->host copy. Only for our plain-torch core attentions: TE's
    needs the device tensors.
    """
    if not has_host_boundaries(params):
        return params
    real, padded = params.host_cu_seqlens, params.host_cu_seqlens_padded
    # The CP group travels with the micro-batch (the layer may install another one): the view
    # is keyed by it rather than patched on every call.
    key = (_HOST_VIEW, id(params.cp_group), params.local_cp_size)
    return params.derived.get(key, lambda: dataclasses.replace(
        params, cu_seqlens_q=real, cu_seqlens_kv=real, cu_seqlens_q_padded=padded,
        cu_seqlens_kv_padded=padded))


def with_padded_as_real(params: PackedSeqParams, on_host_fields: bool = False):
    """A copy whose real boundaries are the padded ones (MTP's roll walks padded sequences),
    with host copies and a cache of its own (other boundaries, other plans). ``on_host_fields``:
    its ``cu_seqlens_q``/``kv`` ARE the host copies (see :func:`with_host_boundaries`)."""
    if params is None or params.cu_seqlens_q_padded is None:
        return params
    padded_q, padded_kv = params.cu_seqlens_q_padded, params.cu_seqlens_kv_padded
    if not has_host_boundaries(params):
        return dataclasses.replace(params, cu_seqlens_q=padded_q, cu_seqlens_kv=padded_kv)
    host_padded = params.host_cu_seqlens_padded
    if on_host_fields:
        padded_q = padded_kv = host_padded
    return dataclasses.replace(params, cu_seqlens_q=padded_q, cu_seqlens_kv=padded_kv,
                               host_cu_seqlens=host_padded, derived=MicroBatchCache())


def host_to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` (host) on ``device`` without making the host wait for the device."""
    if tensor.device == device:  # a CPU run: the tensor itself (a host-sync guard's stand-in)
        return as_device_copy(tensor, device)
    if device.type == "cuda":  # pinned source: a truly asynchronous host->device copy
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)
