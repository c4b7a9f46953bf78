"""Mamba's all-to-all context parallelism on any CP group, in this fork's zigzag THD layout.

megatron-core's ``MambaContextParallel`` turns a CP rank's slice of the sequence (all heads)
into the whole sequence (``heads / cp`` heads) with an all-to-all over its CP group, runs the
convolution and the scan, and turns it back. Two things need changing for this fork:

* **The group is per micro-batch.** megatron-core builds one instance in the mixer's
  constructor over the static CP group. :func:`context_parallel_for` builds one for the group a
  micro-batch carries (head split over that group's size, all-to-all over that group); the mixer
  uses it for the one forward call. Construction only does arithmetic (no collective, no
  parameters of its own: the parameters are sliced per call from the CP-size-1 tensors).
* **The THD reorder.** After the all-to-all the sequence dim is the concatenation of the CP
  ranks' shards in rank order; the scan needs each packed sequence in token order. megatron-core
  computes the permutation with Transformer Engine's ``thd_get_partitioned_indices`` (CUDA);
  this fork's ``cp_split`` uses the same rule (per sequence, 2*cp chunks of the PADDED span, rank
  r keeps chunks r and 2*cp-1-r), so the permutation comes from ``cp_split`` in plain torch, for
  THD (``cu_seqlens_q_padded``) and, as one sequence, for SBHD. It is built on the host, once
  per micro-batch (:mod:`megatron.varlen.mamba.packed_indices`): no layer reads the boundaries
  back from the device.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from megatron.core.packed_seq_params import PackedSeqParams
from megatron.varlen.mamba import triton_stand_in

triton_stand_in.install()  # before megatron.core.ssm (see triton_stand_in.py)

from megatron.core.ssm.mamba_context_parallel import MambaContextParallel  # noqa: E402
from megatron.core.tensor_parallel import all_to_all  # noqa: E402
from megatron.varlen.mamba.packed_indices import cp_reorder  # noqa: E402


# Our own all-to-alls (megatron-core's are private helpers of mamba_context_parallel): the same
# layout, which the parameter slicing we inherit from MambaContextParallel assumes -- feature
# chunk j belongs to CP rank j, and the gathered sequence is the ranks' slices in rank order.
def sequence_to_heads(t: torch.Tensor, cp_group) -> torch.Tensor:
    """[S/cp, b, F] (this rank's slice of the sequence, all features) -> [S, b, F/cp] (every
    rank's slice, in rank order, of this rank's feature chunk): one all-to-all."""
    length, batch, features = t.shape
    size = cp_group.size()
    chunks = torch.split(t.reshape(length * batch, features), features // size, dim=1)
    received = all_to_all(cp_group, torch.cat(chunks, dim=0))  # row block j: rank j's slice
    return received.reshape(length * size, batch, features // size)


def heads_to_sequence(t: torch.Tensor, cp_group) -> torch.Tensor:
    """The inverse of :func:`sequence_to_heads`: [S, b, F/cp] -> [S/cp, b, F]."""
    length, batch, features = t.shape
    size = cp_group.size()
    received = all_to_all(cp_group, t.reshape(length * batch, features))
    chunks = torch.split(received, length // size * batch, dim=0)  # block j: feature chunk j
    return torch.cat(chunks, dim=1).reshape(length // size, batch, features * size)


class VarlenMambaContextParallel(MambaContextParallel):
    """``MambaContextParallel`` with the THD/SBHD reorder computed from ``cp_split``."""

    def pre_conv_ssm(self, input_: torch.Tensor,
                     packed_seq_params: Optional[PackedSeqParams] = None) -> torch.Tensor:
        """[T/cp, b, all features] -> [T, b, features of heads/cp], sequences in token order."""
        if self.cp_size == 1:
            return input_
        z, x, B, C, dt = torch.split(input_, [
            self.d_inner_local_tp, self.d_inner_local_tp, self.ngroups_local_tp * self.d_state,
            self.ngroups_local_tp * self.d_state, self.nheads_local_tp], dim=-1)
        # Each group's B/C is repeated so that every CP rank receives the group of its heads
        # (megatron-core's rule: replicas of one group land on consecutive CP ranks).
        B, C = (self._repeat_groups(t) for t in (B, C))
        parts = [sequence_to_heads(t, self.cp_group) for t in (z, x, B, C, dt)]
        gathered = torch.cat(parts, dim=-1)
        reorder = cp_reorder(packed_seq_params, self.cp_size, gathered.size(0), gathered.device)
        return gathered.index_select(0, reorder.restore)

    def post_conv_ssm(self, input_: torch.Tensor,
                      packed_seq_params: Optional[PackedSeqParams] = None) -> torch.Tensor:
        """Inverse of :meth:`pre_conv_ssm` for the scan output: back to this rank's shard."""
        if self.cp_size == 1:
            return input_
        reorder = cp_reorder(packed_seq_params, self.cp_size, input_.size(0), input_.device)
        return heads_to_sequence(input_.index_select(0, reorder.rank_order), self.cp_group)

    def _repeat_groups(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.group_repeat_count == 1:
            return tensor
        length, batch, _ = tensor.shape
        grouped = tensor.reshape(length, batch, self.ngroups_local_tp, 1, self.d_state)
        repeated = grouped.expand(-1, -1, -1, self.group_repeat_count, -1)
        return repeated.reshape(length, batch, -1)


def context_parallel_for(mixer: Any, cp_group: Any) -> VarlenMambaContextParallel:
    """The mixer's context-parallel helper over ``cp_group`` (any object with size()/rank()).

    Raises:
        AssertionError: (from megatron-core) the mixer's heads or groups on this TP rank do not
            split over the group's size; start-up validation rejects such layouts first.
    """
    return VarlenMambaContextParallel(
        cp_group=cp_group,
        d_inner_local_tp=mixer.d_inner_local_tp,
        nheads_local_tp=mixer.nheads_local_tp,
        ngroups_local_tp=mixer.ngroups_local_tp,
        d_state=mixer.d_state,
        conv1d_cp1=mixer.conv1d,
        dt_bias_cp1=mixer.dt_bias,
        A_log_cp1=mixer.A_log,
        D_cp1=mixer.D,
        D_has_hdim=mixer.D_has_hdim,
    )
