"""megatron-core's ``MambaMixer`` on CPU (kernel twins) and on the micro-batch's CP group.

:class:`VarlenMambaMixer` is a subclass used through the layer spec (``mamba/spec.py``), never
an edit of the installed package. What it changes, and why:

* **Construction without mamba_ssm.** ``MambaMixer.__init__`` refuses to run unless the
  module-level flag ``HAVE_MAMBA_SSM`` is set, and builds its gated norm from the module-level
  class ``ExtendedRMSNorm``, which without mamba_ssm subclasses a ``MagicMock``. Those are the
  only two mamba_ssm names the constructor touches, so while (and only while) the parent
  constructor runs, they are pointed at "available" and at :class:`GatedRMSNorm`, then restored
  in a ``finally`` -- the installed module is left as it was for any other user. With the real
  kernels (GPU with mamba_ssm) nothing is swapped.
* **The training kernels.** ``_ssm_training`` is re-stated here (same steps as megatron-core's)
  so that it calls :func:`select_kernels` instead of the module-level kernel names, and skips
  megatron-core's version check of packages that are absent on CPU.
* **Per-micro-batch CP group.** ``forward`` resolves the micro-batch's group
  (``packed_seq_params.cp_group`` / ``local_cp_size``, else the static group) and, when it is not
  the static one, runs the call with ``self.cp`` replaced by a helper over that group (heads
  split over its size, all-to-all over it); the static helper is restored in a ``finally``. A
  group of size 1 takes megatron-core's no-communication branch: no collective at all.
* **No device->host read per layer.** megatron-core derives ``seq_idx`` (and the CP reorder)
  from the device boundaries in every layer, which synchronises; here both come from the host
  boundaries, built once per micro-batch (:mod:`megatron.varlen.mamba.packed_indices`).
* **TP metadata.** The CP-size-1 parameters megatron-core marks ``tensor_model_parallel`` get
  ``partition_dim = 0`` (they are split along dim 0), which the layout-invariant initialiser
  and the checkpoint code read.
"""

from __future__ import annotations

from typing import Optional

import torch
from einops import rearrange

from megatron.core.packed_seq_params import PackedSeqParams
from megatron.varlen.mamba import triton_stand_in

triton_stand_in.install()  # before megatron.core.ssm: its mixer imports Triton inference ops

from megatron.core.ssm import mamba_mixer as core_mixer  # noqa: E402
from megatron.core.ssm.mamba_mixer import MambaMixer, MambaMixerSubmodules  # noqa: E402, F401
from megatron.varlen.attention.cp_group import resolve_cp_group, swap_attributes  # noqa: E402
from megatron.varlen.mamba.context_parallel import context_parallel_for  # noqa: E402
from megatron.varlen.mamba.gated_norm import GatedRMSNorm  # noqa: E402
from megatron.varlen.mamba.kernels import TORCH_KERNELS, select_kernels  # noqa: E402
from megatron.varlen.mamba.packed_indices import packed_seq_idx  # noqa: E402

_TP_SPLIT_DIM = 0


def _constructor_swaps() -> list[tuple]:
    """Module-level names of megatron-core's mixer to point elsewhere while it constructs."""
    if select_kernels().source != TORCH_KERNELS:
        return []
    return [(core_mixer, "HAVE_MAMBA_SSM", True), (core_mixer, "ExtendedRMSNorm", GatedRMSNorm)]


def _thd_only(packed_seq_params: Optional[PackedSeqParams]) -> Optional[PackedSeqParams]:
    """The params when they describe a THD pack; None for SBHD ones that only carry a group.

    megatron-core's mixer treats any ``packed_seq_params`` as a pack with ``cu_seqlens``; an
    SBHD micro-batch with a CP group (megatron-core's hybrid-CP convention) has none.
    """
    if packed_seq_params is None or packed_seq_params.qkv_format != "thd":
        return None
    return packed_seq_params


class VarlenMambaMixer(MambaMixer):
    """``MambaMixer`` with the kernel adapter and per-micro-batch CP switching (same API)."""

    def __init__(self, *args, **kwargs):
        with swap_attributes(_constructor_swaps()):
            super().__init__(*args, **kwargs)
        self.static_cp_group = self.pg_collection.cp
        self.cp = context_parallel_for(self, self.static_cp_group)
        for param in (self.conv1d.weight, self.conv1d.bias, self.dt_bias, self.A_log, self.D,
                      getattr(getattr(self, "norm", None), "weight", None)):
            if param is not None and getattr(param, "tensor_model_parallel", False):
                param.partition_dim = _TP_SPLIT_DIM
                param.partition_stride = 1

    def forward(self, hidden_states, inference_context=None, *, inference_params=None,
                packed_seq_params: Optional[PackedSeqParams] = None):
        """``MambaMixer.forward`` with ``self.cp`` over the micro-batch's CP group."""
        group = resolve_cp_group(packed_seq_params, self.static_cp_group)
        swaps = [] if group is self.static_cp_group else [
            (self, "cp", context_parallel_for(self, group))]
        with swap_attributes(swaps):
            return super().forward(hidden_states, inference_context,
                                   inference_params=inference_params,
                                   packed_seq_params=_thd_only(packed_seq_params))

    def _create_packed_seq_idx(self, packed_seq_params: PackedSeqParams,
                               total_tokens: int) -> torch.Tensor:
        """megatron-core's [1, total_tokens] sequence index, built once per micro-batch on the
        host (see :func:`packed_seq_idx`)."""
        return packed_seq_idx(packed_seq_params, total_tokens)

    def _ssm_training(self, zxBCdt: torch.Tensor,
                      packed_seq_params: Optional[PackedSeqParams] = None) -> torch.Tensor:
        """Conv + SSD scan + gate through the selected kernels (megatron-core's steps).

        ``zxBCdt``: [l, b, features] after ``self.cp.pre_conv_ssm`` (the whole sequence, this
        rank's heads). Returns this rank's [l / cp, b, d_inner_local_tp] after the gated RMSNorm
        in megatron-core's order, ``norm(y * silu(z))``. Inference never comes here (megatron-
        core routes it to ``_ssm_prefill``/``_decode``, which need mamba_ssm).
        """
        kernels = select_kernels()
        zxBCdt = rearrange(zxBCdt, "l b d -> b l d").contiguous()
        A = -torch.exp(self.cp.get_A_log().float())
        seq_idx = None
        if packed_seq_params is not None:
            seq_idx = self._create_packed_seq_idx(packed_seq_params, zxBCdt.shape[1])
        D = self.cp.get_D()
        if self.D_has_hdim:
            D = rearrange(D.float(), "(h p) -> h p", p=self.headdim)
        y = kernels.mamba_split_conv1d_scan_combined(
            zxBCdt,
            rearrange(self.cp.get_conv1d_weight(), "d 1 w -> d w"),
            self.cp.get_conv1d_bias(),
            self.cp.get_dt_bias().float(),
            A,
            D=D,
            chunk_size=self.chunk_size,
            activation=self.activation,
            headdim=None if self.D_has_hdim else self.headdim,
            ngroups=self.cp.ngroups_local_tpcp,
            norm_before_gate=self.norm_before_gate,
            seq_idx=seq_idx,
        )
        y = rearrange(y, "b l d -> l b d").contiguous()
        y = self.cp.post_conv_ssm(y, packed_seq_params)
        if self.rmsnorm:
            y = self.norm(y)
        return y
